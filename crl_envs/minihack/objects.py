"""The Objects part of a MiniHack observation: what is on the map and exactly where.

Every map cell whose glyph is not floor, wall or darkness (doors, stairs, traps, fountains,
items, monsters, remembered unseen monsters, ...) is listed with NetHack's own screen
description, its symbol and its offset from the agent in compass words and steps, nearest
first::

    staircase down (>): 3 south, 2 east; lichen (F): 1 north (adjacent)

"3 south, 2 east" means 3 rows down and 2 columns right of ``@``; ``(adjacent)`` marks the
8 cells one move away. Nearest means fewest king moves (Chebyshev distance), then fewest
rook moves, then reading order, so the order is deterministic. At most
:data:`MAX_OBJECTS` entries are listed; the rest are counted ("and 3 more farther away").

The source is NLE's ``glyphs`` array, which holds what NetHack displays: seen or remembered
cells only, so a dark room lists nothing NetHack has not shown. Which glyphs count as
floor, wall or darkness is read from NetHack's own symbol table (``defsyms``), so nothing
here depends on our own text.
"""

from __future__ import annotations

import numpy as np

MAX_OBJECTS = 16
# NetHack's names for the map symbols that are never listed: rock and dark floor (both
# "dark part of a room"), the eleven wall pieces, lit floor and corridors (floors too).
NOT_LISTED = frozenset({"dark part of a room", "wall", "floor of a room", "corridor", "lit corridor"})
_DESC_CACHE_MAX = 4096


def listed_glyph_table() -> np.ndarray:
    """A boolean per NetHack glyph (index ``MAX_GLYPH`` is ``NO_GLYPH``): whether it is listed.

    Every glyph is listed (monsters, objects, statues, warnings, swallow and zap effects)
    except the map symbols whose ``defsyms`` explanation is in :data:`NOT_LISTED`.
    """
    from nle import nethack

    table = np.ones(nethack.MAX_GLYPH + 1, dtype=bool)
    table[nethack.NO_GLYPH] = False
    for i in range(nethack.MAXPCHARS):
        if nethack.symdef.from_idx(i).explanation in NOT_LISTED:
            table[nethack.GLYPH_CMAP_OFF + i] = False
    return table


def offset_words(rows: int, cols: int) -> str:
    """An offset from the agent in compass words: ``3 south, 2 east``, ``1 north (adjacent)``.

    Args:
        rows: rows below the agent (negative: above).
        cols: columns right of the agent (negative: left).
    """
    parts = []
    if rows:
        parts.append(f"{abs(rows)} {'south' if rows > 0 else 'north'}")
    if cols:
        parts.append(f"{abs(cols)} {'east' if cols > 0 else 'west'}")
    text = ", ".join(parts) or "here"
    return f"{text} (adjacent)" if max(abs(rows), abs(cols)) == 1 else text


class ObjectFinder:
    """Lists the things on a NetHack map around the agent; caches that are valid across episodes."""

    def __init__(self, max_objects: int = MAX_OBJECTS):
        if max_objects < 1:
            raise ValueError(f"max_objects must be at least 1, got {max_objects}")
        self.max_objects = max_objects
        self._listed = listed_glyph_table()
        self._descs: dict[bytes, str] = {}
        self._offsets: dict[tuple[int, int], str] = {}

    def cells(self, glyphs: np.ndarray, row: int, col: int) -> list[int]:
        """Flat indices (``row * width + col``) of the listed cells, the agent's own cell left out.

        Unordered beyond reading order; one table lookup over the whole map, no Python loop
        over cells.
        """
        flat = self._listed.take(glyphs.ravel()).nonzero()[0].tolist()
        if flat:
            me = row * glyphs.shape[1] + col
            if me in flat:
                flat.remove(me)
        return flat

    def description(self, descs: np.ndarray, r: int, c: int) -> str:
        """NetHack's screen description of cell ``(r, c)`` (cached by its raw bytes)."""
        raw = descs[r, c].tobytes()
        d = self._descs.get(raw)
        if d is None:
            d = raw.split(b"\x00", 1)[0].decode("latin-1").strip()
            if len(self._descs) < _DESC_CACHE_MAX:
                self._descs[raw] = d
        return d

    def describe(self, obs: dict[str, np.ndarray], chars: bytes, cells: list[int], row: int, col: int) -> str:
        """The Objects text for ``cells`` (from :meth:`cells`), nearest first and capped.

        Args:
            obs: NLE's observation (``glyphs`` for the width, ``screen_descriptions``).
            chars: ``obs["chars"].tobytes()``, the symbols.
            cells: the listed cells' flat indices.
            row, col: the agent's cell.
        """
        if not cells:
            return "none in sight"
        width = obs["glyphs"].shape[1]
        ranked = []
        for i in cells:
            r, c = divmod(i, width)
            dr, dc = r - row, c - col
            adr, adc = abs(dr), abs(dc)
            ranked.append((max(adr, adc), adr + adc, i, dr, dc))
        ranked.sort()
        descs, offsets = obs["screen_descriptions"], self._offsets
        parts = []
        for _, _, i, dr, dc in ranked[: self.max_objects]:
            off = offsets.get((dr, dc))
            if off is None:
                off = offsets[(dr, dc)] = offset_words(dr, dc)
            desc = self.description(descs, *divmod(i, width)) or "unknown"
            parts.append(f"{desc} ({chr(chars[i])}): {off}")
        if len(ranked) > self.max_objects:
            parts.append(f"and {len(ranked) - self.max_objects} more farther away")
        return "; ".join(parts)
