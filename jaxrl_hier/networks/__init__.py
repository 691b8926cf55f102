"""Policy and value networks."""

from jaxrl_hier.networks.actor_critic import MASKED_LOGIT, ActorCriticCNN, ActorCriticMLP
from jaxrl_hier.networks.gps import GPSActorCritic
from jaxrl_hier.networks.make import make_network
from jaxrl_hier.networks.recurrent import ActorCriticGRU, ScannedGRU

__all__ = ["MASKED_LOGIT", "ActorCriticCNN", "ActorCriticGRU", "ActorCriticMLP", "GPSActorCritic", "ScannedGRU", "make_network"]
