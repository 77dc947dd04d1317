"""Elastic training over pycoll's fault-tolerant communicators: ``pycoll.elastic.run`` keeps a training
loop going through lost ranks (shrink, roll back to the last in-memory commit) and new ones (grow, hand
them the state), without a checkpoint file and without losing or repeating a committed step."""

from pycoll.elastic.loop import Change, ElasticResult, StepContext, run

__all__ = ["Change", "ElasticResult", "StepContext", "run"]
