"""Shared guard for the SWE test modules: they need swebench and a bubblewrap that can make namespaces."""

from __future__ import annotations

import shutil

import pytest


def skip_module_without_bwrap() -> None:
    """Skip the calling test module, saying why, where the bwrap sandbox cannot run."""
    require_bwrap(module=True)


def require_bwrap(module: bool = False) -> None:
    """Skip the calling test (or module), saying why, where the bwrap sandbox cannot run."""
    pytest.importorskip("swebench")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (apt-get install bubblewrap)", allow_module_level=module)
    from crl_envs.swe.sandbox import bwrap_mode

    try:
        bwrap_mode()
    except RuntimeError as e:  # bwrap installed but namespaces are not allowed here
        pytest.skip(str(e), allow_module_level=module)
