"""crl-bench envs inside other people's trainers.

Each module adapts any registered text env (ours, a plugin's, or one served by
``python -m crl_envs.serve`` and played as ``crl/Remote-v0``) to one framework's interface, and
imports that framework only when used:

* :mod:`crl_envs.integrations.trl`: TRL's ``GRPOTrainer(environment_factory=...)``
  (``pip install -e ".[trl]"``).
* :mod:`crl_envs.integrations.verifiers`: a verifiers ``MultiTurnEnv`` (``pip install -e ".[verifiers]"``).

Nothing here imports ``crl_agent`` or ``eval``.
"""
