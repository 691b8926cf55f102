"""jaxrl_hier: JAX-native reinforcement learning with the whole training loop on the accelerator."""

__version__ = "0.1.0"
