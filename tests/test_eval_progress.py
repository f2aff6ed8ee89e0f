"""``eval.run``'s progress bar: it moves a little at each step and ends exactly at its total."""

from __future__ import annotations

import warnings

from eval.run import main


def test_the_progress_bar_ends_at_its_total_without_clamping_or_negative_time_left(tmp_path, capfd):
    # a 10-step cap: ten steps of 1/10 sum to 1.0000000000000002 in floats, and four such episodes passed the
    # total (tqdm warned "clamping frac to range [0, 1]" and showed "<-00:00" left)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["--agent", "random", "--tasks", "crl/Sokoban-6x6-2-v0", "--episodes", "4", "--max-steps", "10",
                     "--seed", "3", "--out", str(tmp_path / "run")]) == 0
    err = capfd.readouterr().err
    assert not [w for w in caught if "clamping frac" in str(w.message)]
    assert "clamping frac" not in err and "<-" not in err, err
    assert "4.0/4" in err
