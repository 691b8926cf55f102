"""Policy and value networks."""

from jaxrl_hier.networks.actor_critic import ActorCriticCNN, ActorCriticMLP, make_network

__all__ = ["ActorCriticCNN", "ActorCriticMLP", "make_network"]
