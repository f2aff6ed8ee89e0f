"""Credit rules for the experience extractor, as plain Python (no torch): reward and weight of one call.

These are the scalar rules behind :func:`crl_agent.rl.extractor_rewards` and
:func:`crl_agent.rl.count_aware_weights`; the call log (:mod:`crl_agent.experience.calllog`)
uses them directly so that folding a log needs no torch import.

Meta-reward (DESIGN section 7, "Extractor"; issue 15): an extractor generation is credited with the
mean outcome of every episode its entries guided, where an outcome of 0 (a failure recorded as
success = 0) counts as -1, so that guiding failures is punished rather than ignored.

Count-aware weight (the official code's ``memory_repeat_weight_power`` and
``memory_repeat_cooldown_steps``): ``w = 0`` if the entry was trained within the last ``cooldown``
steps, else ``w = (1 + train_count) ** -power``. It damps entries that keep being retrieved and
trained on, so one popular entry does not dominate the extractor's updates. The official code
zeroes the weight when ``step - last_trained_step < cooldown``; issue 15 and DESIGN write ``<=``,
which is what we implement (with the default ``cooldown=1``: no training on an entry in the step
right after it was trained).
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def meta_reward(outcomes: Iterable[float]) -> float | None:
    """Mean of the outcomes of the episodes a generation guided, an outcome of 0 counting as -1.

    Args:
        outcomes: one outcome per guided episode (success 0/1, or already ±1).

    Returns:
        The mean, or ``None`` when the generation has guided no episode yet (no reward to learn from).

    Raises:
        ValueError: an outcome is not a finite number.
    """
    values = []
    for o in outcomes:
        o = float(o)
        if not math.isfinite(o):
            raise ValueError(f"episode outcomes must be finite numbers, got {o}")
        values.append(-1.0 if o == 0.0 else o)
    if not values:
        return None
    return sum(values) / len(values)


def trained_recently(last_trained_step: int | None, step: int, cooldown: int = 1) -> bool:
    """Whether an entry last trained at ``last_trained_step`` is still cooling down at ``step``.

    ``None`` or a negative value (the official code's ``-1`` sentinel) means "never trained".
    """
    if last_trained_step is None or last_trained_step < 0:
        return False
    return step - last_trained_step <= cooldown


def count_aware_weight(
    train_count: int, last_trained_step: int | None, step: int, cooldown: int = 1, power: float = 0.5
) -> float:
    """``0`` while cooling down (see :func:`trained_recently`), else ``(1 + train_count) ** -power``.

    Raises:
        ValueError: ``train_count`` is negative, or ``cooldown``/``power`` is negative.
    """
    if train_count < 0:
        raise ValueError(f"train_count must be >= 0, got {train_count}")
    if cooldown < 0 or power < 0:
        raise ValueError(f"cooldown and power must be >= 0, got cooldown={cooldown}, power={power}")
    if trained_recently(last_trained_step, step, cooldown):
        return 0.0
    return (1.0 + train_count) ** -power
