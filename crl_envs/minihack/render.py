"""Text rendering of NetHack observations: map, status lines, position, objects, legend, inventory.

NLE hands back views into buffers it reuses every step, so nothing here keeps a reference
to an array: everything is read out as bytes (``ndarray.tobytes``, one C copy) and sliced
in Python, which is much cheaper than numpy calls on arrays this small. Only the cells of
the trimmed map are scanned for the legend, and decoded descriptions and inventories are
cached by their raw bytes. The Objects part comes from :mod:`crl_envs.minihack.objects`.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import numpy as np

from crl_envs.minihack.objects import MAX_OBJECTS, ObjectFinder


def text_of(arr: np.ndarray) -> str:
    """A NUL-terminated NetHack byte string (``message``, one ``inv_strs`` row) as text."""
    return arr.tobytes().split(b"\x00", 1)[0].decode("latin-1").strip()


def _span(cells: bytes, stride: int) -> tuple[int, int]:
    """``[first, last + 1)`` over the ``stride``-long runs of ``cells`` that hold a non-space byte.

    Only spaces count as blank (other whitespace, never seen on a NetHack map, widens the
    span); an all-blank ``cells`` gives ``(len // stride, 0)``.
    """
    head = len(cells) - len(cells.lstrip(b" "))
    return head // stride, (len(cells.rstrip(b" ")) - 1) // stride + 1


def map_box(chars: np.ndarray, raw: bytes | None = None) -> tuple[list[str], int, int]:
    """The dungeon map trimmed to the bounding box of its non-blank (non-space) cells.

    Rows and columns are found with C-level byte strips over the map and its transpose,
    with no Python loop over cells or rows.

    Args:
        chars: NLE's ``chars`` observation, shape ``(21, 79)``.
        raw: ``chars.tobytes()``, where the caller has it already.

    Returns:
        The box's rows as text, and the box's top-left ``(row, col)`` on the screen
        (``([], 0, 0)`` when the map is blank).
    """
    h, w = chars.shape
    if raw is None:
        raw = chars.tobytes()
    r0, r1 = _span(raw, w)
    if r1 <= r0:
        return [], 0, 0
    c0, c1 = _span(chars.T.tobytes(), h)
    text = raw[r0 * w:r1 * w].decode("latin-1")
    return [text[i:i + c1 - c0] for i in range(c0, (r1 - r0) * w, w)], r0, c0


class Renderer:
    """Renders one env's observations; holds caches that are valid across episodes.

    Args:
        goal: the goal text shown on the first line.
        show_inventory: whether to render the inventory (KeyRoom tasks).
        show_objects: whether to render the Objects part (without it, the legend describes
            every symbol on the map).
        max_objects: the most entries the Objects part lists.
    """

    def __init__(self, goal: str, show_inventory: bool, show_objects: bool = True, max_objects: int = MAX_OBJECTS):
        self.goal = goal
        self.show_inventory = show_inventory
        self.show_objects = show_objects
        self.finder = ObjectFinder(max_objects)
        self._inv_key = b""
        self._inv_text = "(empty)"

    def legend(self, obs: dict[str, np.ndarray], lines: list[str], r0: int, c0: int,
               listed: Container[int] = ()) -> str:
        """One NetHack screen description per distinct symbol on the map, listed cells left out.

        Symbols are sorted by code; each is described by its first cell in reading order
        that is not in ``listed`` (flat screen indices of the cells the Objects part already
        describes), so the legend names floor, walls, darkness and you, and a symbol shown
        only on listed cells is not repeated. Every non-blank cell lies inside the trimmed box.
        """
        if not lines:
            return ""
        width = len(lines[0])
        flat = "".join(lines)
        screen_width = obs["screen_descriptions"].shape[1]
        descs, describe = obs["screen_descriptions"], self.finder.description
        parts = []
        for ch in sorted(set(flat) - {" "}):
            i = flat.index(ch)
            r, c = r0 + i // width, c0 + i % width
            while r * screen_width + c in listed:
                i = flat.find(ch, i + 1)
                if i < 0:
                    break
                r, c = r0 + i // width, c0 + i % width
            if i < 0:
                continue
            d = describe(descs, r, c)
            parts.append(f"{ch} {d}" if d else ch)
        return "; ".join(parts)

    def inventory(self, obs: dict[str, np.ndarray]) -> str:
        """The inventory as "letter - item" joined by "; ", or "(empty)".

        The letters are what NetHack's item questions ("What do you want to use or
        apply? [f or ?*]") take as answers.
        """
        strs, letters = obs["inv_strs"], obs["inv_letters"]
        key = strs.tobytes() + letters.tobytes()
        if key != self._inv_key:
            items = [f"{chr(letters[i])} - {text_of(strs[i])}" for i in np.flatnonzero(strs[:, 0])]
            self._inv_key, self._inv_text = key, "; ".join(items) if items else "(empty)"
        return self._inv_text

    def render(self, obs: dict[str, np.ndarray], message: str, prompt: str, actions: Sequence[str]) -> str:
        """The full text observation.

        Args:
            obs: NLE's observation dict (``glyphs``, ``chars``, ``blstats``, ``screen_descriptions``,
                ``tty_chars``, and ``inv_strs``/``inv_letters`` for the inventory).
            message: NetHack's messages since the last action.
            prompt: NetHack's pending question, or "".
            actions: the admissible actions to list.
        """
        chars = obs["chars"]
        raw = chars.tobytes()
        lines, r0, c0 = map_box(chars, raw)
        bl = obs["blstats"]
        x, y, hp, max_hp = int(bl[0]), int(bl[1]), int(bl[10]), int(bl[11])
        tty = obs["tty_chars"]
        w = tty.shape[1]
        bottom = tty[22:24].tobytes().decode("latin-1")
        status = f"{bottom[:w].rstrip()}\n{bottom[w:].rstrip()}"
        out = [
            f"Goal: {self.goal}",
            f"Message: {message or '(none)'}",
            "Map:",
            *lines,
            status,
            f"You (@) are at row {y - r0}, column {x - c0} of the map. HP {hp}/{max_hp}.",
        ]
        if self.show_objects:
            listed = self.finder.cells(obs["glyphs"], y, x)
            out.append(f"Objects: {self.finder.describe(obs, raw, listed, y, x)}")
            out.append(f"Legend: {self.legend(obs, lines, r0, c0, set(listed))}")
        else:
            out.append(f"Legend: {self.legend(obs, lines, r0, c0)}")
        if self.show_inventory:
            out.append("Inventory: " + self.inventory(obs))
        if prompt:
            out.append(f"NetHack asks: {prompt} (answer with a letter, a direction, or escape)")
        out.append("Actions: " + ", ".join(actions))
        return "\n".join(out)
