"""Seeded ALFWorld scenes from the floor plans the ``alfworld`` wheel ships.

A scene is one real AI2-THOR floor plan (kitchen, living room, bedroom or bathroom):

* its static receptacles, with their real ids and interaction points from
  ``gen/layouts/FloorPlan<N>-openable.json``; receptacle classes the floor plan lists in
  ``FloorPlan<N>-objects.json`` but that file lacks (garbage cans, stove burners, toilets, ...)
  get an id and a point drawn from the floor plan's reachable grid (``FloorPlan<N>-layout.npy``);
* every pickupable object class of the floor plan, one to three instances each, each put in a
  receptacle that can hold it according to ``gen/constants.py`` (``VAL_RECEPTACLE_OBJECTS``);
* desk and floor lamps, standing on furniture.

Ids follow AI2-THOR/ALFWorld naming (``Sink|-01.90|+00.97|-01.50|SinkBasin``); the PDDL writer
mangles them (``Sink_bar__minus_01_dot_90_bar_..._bar_SinkBasin``) and alfworld's demangler
turns them back into ``sinkbasin 1``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

import numpy as np

ROOM_TYPES = {"Kitchen": range(1, 31), "LivingRoom": range(201, 231), "Bedroom": range(301, 331),
              "Bathroom": range(401, 431)}
LAMPS = ("DeskLamp", "FloorLamp")
# Furniture a lamp can stand on (lamps are toggleable, not pickupable).
LAMP_STANDS = ("SideTable", "Desk", "Dresser", "Shelf", "TVStand", "CoffeeTable", "DiningTable", "CounterTop")
# How many instances a receptacle class gets when the floor plan names it but has no position for it.
_SYNTH_COUNTS = {"StoveBurner": (2, 4), "HandTowelHolder": (1, 2), "Drawer": (2, 4), "Shelf": (2, 3)}


@dataclass(frozen=True)
class Receptacle:
    """A static receptacle: its AI2-THOR id, class, and the agent's interaction point."""

    id: str
    cls: str
    location: str  # "loc|x|z|rotation|horizon" on the 0.25 m grid


@dataclass(frozen=True)
class SceneObject:
    """A pickupable object (or a lamp) inside a receptacle."""

    id: str
    cls: str
    receptacle: str


@dataclass
class Scene:
    """A floor plan filled with objects, before a task is chosen."""

    floor_plan: int
    room_type: str
    receptacles: list[Receptacle]
    objects: list[SceneObject] = field(default_factory=list)
    agent_location: str = ""

    def receptacles_of(self, cls: str) -> list[Receptacle]:
        return [r for r in self.receptacles if r.cls == cls]

    def objects_of(self, cls: str) -> list[SceneObject]:
        return [o for o in self.objects if o.cls == cls]

    def classes(self) -> set[str]:
        return {o.cls for o in self.objects}

    def receptacle_classes(self) -> set[str]:
        return {r.cls for r in self.receptacles}


@functools.lru_cache(maxsize=1)
def _constants():
    import alfworld.gen.constants as constants

    return constants


def layouts_dir() -> str:
    return os.path.join(os.path.dirname(_constants().__file__), "layouts")


def room_type_of(floor_plan: int) -> str:
    for name, numbers in ROOM_TYPES.items():
        if floor_plan in numbers:
            return name
    raise ValueError(f"FloorPlan{floor_plan} is not a kitchen, living room, bedroom or bathroom")


def can_contain(recep_cls: str, obj_cls: str) -> bool:
    """Whether ALFRED lets ``obj_cls`` be put in ``recep_cls`` (``constants.VAL_RECEPTACLE_OBJECTS``)."""
    return obj_cls in _constants().VAL_RECEPTACLE_OBJECTS.get(recep_cls, ())


def static_receptacle_classes() -> set[str]:
    c = _constants()
    return set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)


def pickupable_classes() -> set[str]:
    """Object classes something can hold: the pickupable objects of ALFRED."""
    c = _constants()
    return {o for objs in c.VAL_RECEPTACLE_OBJECTS.values() for o in objs
            if not o.endswith("Sliced") and o in c.OBJECTS_SET} - static_receptacle_classes()


def action_classes(kind: str) -> set[str]:
    """``Cleanable``, ``Heatable``, ``Coolable``, ``Toggleable`` or ``Sliceable`` classes."""
    return set(_constants().VAL_ACTION_OBJECTS[kind])


def openable_classes() -> set[str]:
    return set(_constants().OPENABLE_CLASS_LIST)


@functools.cache
def floor_plan_data(floor_plan: int) -> tuple[tuple[str, ...], dict[str, tuple[float, float, int, int]], np.ndarray]:
    """(object classes, receptacle id -> interaction point, reachable grid points) of a floor plan."""
    base = os.path.join(layouts_dir(), f"FloorPlan{floor_plan}")
    try:
        with open(base + "-objects.json") as f:
            classes = tuple(json.load(f))
        with open(base + "-openable.json") as f:
            points = {k: tuple(v) for k, v in json.load(f).items()}
        grid = np.load(base + "-layout.npy")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e.filename}: the alfworld wheel's layouts are missing; "
                                "reinstall it (pip install alfworld==0.4.2)") from e
    return classes, points, grid


def floor_plans(room_types: tuple[str, ...] | None = None) -> list[int]:
    """Every floor plan the wheel ships, optionally restricted to some room types."""
    names = room_types or tuple(ROOM_TYPES)
    return [n for name in names for n in ROOM_TYPES[name]
            if os.path.exists(os.path.join(layouts_dir(), f"FloorPlan{n}-objects.json"))]


def _loc(x: float, z: float, rotation: float, horizon: float) -> str:
    return f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{round(rotation / 90) % 4}|{int(horizon)}"


def _coord(v: float) -> str:
    return f"{v:+06.2f}"


def _thor_id(cls: str, xyz: tuple[float, float, float], suffix: str = "") -> str:
    return f"{cls}|{_coord(xyz[0])}|{_coord(xyz[1])}|{_coord(xyz[2])}" + (f"|{suffix}" if suffix else "")


def _class_of_thor_id(thor_id: str) -> str:
    parts = thor_id.split("|")
    return parts[4] if len(parts) == 5 else parts[0]


def build_scene(floor_plan: int, rng: np.random.Generator, *, extra_instances: dict[str, int] | None = None,
                forbidden: dict[str, set[str]] | None = None) -> Scene:
    """Fill one floor plan with receptacles, objects and lamps.

    Args:
        floor_plan: the AI2-THOR floor plan number.
        rng: the only source of randomness.
        extra_instances: minimum instance counts for some classes (e.g. 2 for a pick-two target).
        forbidden: object class -> receptacle classes it must not start in (keeps goals unsatisfied).

    Returns:
        The scene; objects with no receptacle that can hold them are left out.
    """
    classes, points, grid = floor_plan_data(floor_plan)
    static = static_receptacle_classes()
    receptacles = [Receptacle(rid, _class_of_thor_id(rid), _loc(*points[rid])) for rid in sorted(points)]
    receptacles = [r for r in receptacles if r.cls in static]
    used_points = {r.location.rsplit("|", 2)[0] for r in receptacles}
    have = {r.cls for r in receptacles}
    free = [tuple(p) for p in grid.tolist() if _loc(p[0], p[1], 0, 0).rsplit("|", 2)[0] not in used_points]
    for cls in sorted(set(classes) & static - have):
        lo, hi = _SYNTH_COUNTS.get(cls, (1, 1))
        for _ in range(int(rng.integers(lo, hi + 1))):
            x, z = free.pop(int(rng.integers(len(free)))) if free else tuple(grid[int(rng.integers(len(grid)))])
            rotation, horizon = int(rng.integers(4)) * 90, 30
            dx, dz = [(0, 1), (1, 0), (0, -1), (-1, 0)][rotation // 90]
            height = round(float(rng.uniform(0.0, 1.0)), 2)
            suffix = cls if cls in ("SinkBasin", "BathtubBasin") else ""
            base = {"SinkBasin": "Sink", "BathtubBasin": "Bathtub"}.get(cls, cls)
            rid = _thor_id(base, (x + 0.6 * dx, height, z + 0.6 * dz), suffix)
            receptacles.append(Receptacle(rid, cls, _loc(x, z, rotation, horizon)))
    receptacles.sort(key=lambda r: r.id)
    scene = Scene(floor_plan, room_type_of(floor_plan), receptacles)
    scene.agent_location = _agent_start(grid, {r.location for r in receptacles}, rng)
    _place_objects(scene, classes, rng, extra_instances or {}, forbidden or {})
    return scene


def _agent_start(grid: np.ndarray, taken: set[str], rng: np.random.Generator) -> str:
    for _ in range(100):
        x, z = grid[int(rng.integers(len(grid)))].tolist()
        loc = _loc(x, z, int(rng.integers(4)) * 90, 30)
        if loc not in taken:
            return loc
    return _loc(0.0, 0.0, 0, 60)


def _place_objects(scene: Scene, classes: tuple[str, ...], rng: np.random.Generator,
                   extra: dict[str, int], forbidden: dict[str, set[str]]) -> None:
    pickupable = pickupable_classes()
    by_id = {r.id: r for r in scene.receptacles}
    taken_ids = set(by_id)
    for cls in sorted(set(classes) & (pickupable | set(LAMPS))):
        if cls in LAMPS:
            stands = [r for r in scene.receptacles if r.cls in LAMP_STANDS and r.cls not in openable_classes()]
            options, count = stands, 1
        else:
            banned = forbidden.get(cls, set())
            options = [r for r in scene.receptacles if can_contain(r.cls, cls) and r.cls not in banned]
            count = max(int(rng.choice([1, 1, 1, 2, 2, 3])), extra.get(cls, 0))
        if not options:
            continue
        for _ in range(count):
            recep = options[int(rng.integers(len(options)))]
            rx, ry, rz = (float(v) for v in recep.id.split("|")[1:4])
            while True:
                oid = _thor_id(cls, (rx + float(rng.uniform(-0.4, 0.4)), ry + float(rng.uniform(0.0, 0.3)),
                                     rz + float(rng.uniform(-0.4, 0.4))))
                if oid not in taken_ids:
                    break
            taken_ids.add(oid)
            scene.objects.append(SceneObject(oid, cls, recep.id))
