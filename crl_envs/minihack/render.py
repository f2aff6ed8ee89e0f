"""Text rendering of NetHack observations: map, status lines, position, objects, legend, inventory.

NLE hands back views into buffers it reuses every step, so nothing here keeps a reference
to an array: everything is read out as bytes (``ndarray.tobytes``, one C copy, or a
memoryview) and sliced in Python, which is much cheaper than numpy calls on arrays this
small. The legend's symbols are found by byte searches, decoded descriptions and
inventories are cached by their raw bytes, and the map, Objects and legend text is reused
while everything it is made from is unchanged. The Objects part comes from
:mod:`crl_envs.minihack.objects`.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import numpy as np

from crl_envs.minihack.objects import MAX_OBJECTS, ObjectFinder, byte_view

_KEEP_CONTROL = bytes.maketrans(b"\t\n\r\x0b\x0c", b"?????")


def text_of(arr: np.ndarray) -> str:
    """A NUL-terminated NetHack byte string (``message``, one ``inv_strs`` row) as text."""
    return arr.tobytes().split(b"\x00", 1)[0].decode("latin-1").strip()


def _span(cells: bytes, stride: int) -> tuple[int, int]:
    """``[first, last + 1)`` over the ``stride``-long runs of ``cells`` that hold a non-space byte.

    ``cells`` must have passed :func:`_no_control`, so that the argument-free ``strip()``
    (several times cheaper than ``strip(b" ")``) strips spaces only; an all-blank
    ``cells`` gives ``(len // stride, 0)``.
    """
    head = len(cells) - len(cells.lstrip())
    return head // stride, (len(cells.rstrip()) - 1) // stride + 1


def _no_control(cells: bytes) -> bytes:
    """``cells`` with ASCII whitespace other than space (never seen on a NetHack map) made non-blank."""
    if b"\t" in cells or b"\n" in cells or b"\r" in cells or b"\x0b" in cells or b"\x0c" in cells:
        return cells.translate(_KEEP_CONTROL)
    return cells


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
    probe = _no_control(raw)
    r0, r1 = _span(probe, w)
    if r1 <= r0:
        return [], 0, 0
    columns = chars.T.tobytes()  # the same bytes, so the same control check applies
    c0, c1 = _span(columns if probe is raw else columns.translate(_KEEP_CONTROL), h)
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
        # The last map, Objects and legend text, with what it was made from (see _view).
        self._view_key: tuple = ()
        self._view_descs: list[tuple[int, bytes]] = []
        self._view_text: tuple[list[str], int, int, list[str]] = ([], 0, 0, [])

    def legend(self, obs: dict[str, np.ndarray], lines: list[str], r0: int, c0: int,
               used: list[int] | None = None) -> str:
        """One NetHack screen description per distinct symbol on the map (the observation without Objects).

        Symbols are sorted by code; each is described by its first cell in reading order,
        which lies inside the trimmed box because every non-blank cell does. The described
        cells are appended to ``used`` if given.
        """
        if not lines:
            return ""
        width = len(lines[0])
        flat = "".join(lines)
        descs = byte_view(obs["screen_descriptions"])
        screen_width, length = obs["screen_descriptions"].shape[1:]
        parts = []
        for ch in sorted(set(flat) - {" "}):
            i = flat.index(ch)
            cell = (r0 + i // width) * screen_width + c0 + i % width
            if used is not None:
                used.append(cell)
            d = self.finder.description(descs, cell, length)
            parts.append(f"{ch} {d}" if d else ch)
        return "; ".join(parts)

    def terrain_legend(self, chars: bytes, listed: Container[int], me: int, descs: memoryview, length: int,
                       used: list[int] | None = None) -> str:
        """The legend beside the Objects part: the symbols of floor, walls and darkness, and you.

        Each symbol is described by its first cell in reading order that the Objects part
        does not list (a ``-`` may be a wall or an open door). Symbols are found with
        C-level byte searches over the screen, with no Python loop over cells.

        Args:
            chars: ``chars.tobytes()``.
            listed: the flat indices the Objects part lists.
            me: the agent's flat index.
            descs: :func:`byte_view` of ``screen_descriptions``; ``length``: bytes per description.
            used: if given, the described cells are appended to it.
        """
        describe = self.finder.description
        mine = chars[me]
        parts = []
        for ch in sorted({*self.finder.terrain_symbols, mine} - {ord(" ")}):
            if ch == mine:
                i = me
            else:
                i = chars.find(ch)
                while i >= 0 and i in listed:
                    i = chars.find(ch, i + 1)
                if i < 0:
                    continue
            if used is not None:
                used.append(i)
            d = describe(descs, i, length)
            parts.append(f"{chr(ch)} {d}" if d else chr(ch))
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

    def _view(self, obs: dict[str, np.ndarray], y: int, x: int) -> tuple[list[str], int, int, list[str]]:
        """The map rows, the box's top-left, and the Objects and Legend lines.

        They depend only on ``chars``, ``glyphs``, the agent's cell and the descriptions of
        the cells they describe, so the last ones are reused when all of those are byte for
        byte the same (a move into a wall, an answer to a question): comparing them costs a
        few memcmps, rebuilding them costs most of a render.
        """
        chars, sd = obs["chars"], obs["screen_descriptions"]
        raw = chars.tobytes()
        key = (raw, obs["glyphs"].tobytes(), y, x)
        descs, length = byte_view(sd), sd.shape[-1]
        if key == self._view_key and all(descs[i * length:(i + 1) * length] == d for i, d in self._view_descs):
            return self._view_text
        lines, r0, c0 = map_box(chars, raw)
        used: list[int] = []
        if self.show_objects:
            listed = self.finder.cells(obs["glyphs"], y, x)
            objects = self.finder.describe(obs, raw, listed, y, x, descs, used)
            legend = self.terrain_legend(raw, set(listed), y * chars.shape[1] + x, descs, length, used)
            parts = [f"Objects: {objects}", f"Legend: {legend}"]
        else:
            parts = [f"Legend: {self.legend(obs, lines, r0, c0, used)}"]
        self._view_key = key
        self._view_descs = [(i, descs[i * length:(i + 1) * length].tobytes()) for i in used]
        self._view_text = (lines, r0, c0, parts)
        return self._view_text

    def render(self, obs: dict[str, np.ndarray], message: str, prompt: str, actions: Sequence[str]) -> str:
        """The full text observation.

        Args:
            obs: NLE's observation dict (``glyphs``, ``chars``, ``blstats``, ``screen_descriptions``,
                ``tty_chars``, and ``inv_strs``/``inv_letters`` for the inventory).
            message: NetHack's messages since the last action.
            prompt: NetHack's pending question, or "".
            actions: the admissible actions to list.
        """
        bl = obs["blstats"]
        x, y, hp, max_hp = int(bl[0]), int(bl[1]), int(bl[10]), int(bl[11])
        lines, r0, c0, parts = self._view(obs, y, x)
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
            *parts,
        ]
        if self.show_inventory:
            out.append("Inventory: " + self.inventory(obs))
        if prompt:
            out.append(f"NetHack asks: {prompt} (answer with a letter, a direction, or escape)")
        out.append("Actions: " + ", ".join(actions))
        return "\n".join(out)
