"""SWE-bench style tasks: real repositories, shell actions in a sandbox, SWE-bench grading.

* :mod:`~crl_envs.swe.instances`: the instance schema, JSON/JSONL/parquet loaders, repository lookup;
* :mod:`~crl_envs.swe.bundled`: the offline set behind ``crl/SWE-Mini-v0``, generated in code;
* :mod:`~crl_envs.swe.sandbox`: the ``bwrap`` (default), ``local`` and ``docker`` sandboxes;
* :mod:`~crl_envs.swe.grading`: SWE-bench grading with swebench's parsers and report;
* :mod:`~crl_envs.swe.env`: :class:`~crl_envs.swe.env.SWEEnv`, the text env.
"""

from __future__ import annotations

from crl_envs.swe.instances import InstanceFileError, SWEInstance, load_instances, save_instances
from crl_envs.swe.sandbox import Limits, SandboxUnavailable

__all__ = ["InstanceFileError", "Limits", "SWEInstance", "SandboxUnavailable", "load_instances", "save_instances"]
