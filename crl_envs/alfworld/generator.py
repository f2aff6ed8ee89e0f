"""Procedural ALFWorld problems: a seeded task on a real floor plan, written as a ``game.tw-pddl``.

For a seed and one of ALFWorld's six task types the generator

1. picks a floor plan of a room type ALFRED allows for the task (``constants.GOALS_VALID``)
   that has what the task needs (a sink, microwave, fridge or lamp);
2. picks the target object class (cleanable/heatable/coolable where the task says so) and a
   receptacle class that can hold it, then fills the scene (see :mod:`crl_envs.alfworld.scene`)
   with no target object already where the goal wants it;
3. writes the PDDL problem in ALFWorld's own form (mangled AI2-THOR ids, ``canContain`` facts,
   closed openable receptacles) with the goal from ``gen/goal_library.py`` and the goal text
   from the same library's templates, and puts it in a game dict with the shipped domain and
   grammar.

:mod:`crl_envs.alfworld.games` then runs the planner on it, stores the plan and caches it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass

import numpy as np

from crl_envs.alfworld import scene as sc

GENERATOR_VERSION = 1
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# The appliance a task uses, and the action class its object must belong to.
_APPLIANCE = {"pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
              "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
              "pick_cool_then_place_in_recep": ("Fridge", "Coolable")}
# Type constants the domain's actions name; they must exist in every problem.
_DOMAIN_RTYPES = ("SinkBasin", "Microwave", "Fridge")
_DOMAIN_OTYPES = ("Knife", "ButterKnife")
_MANGLE = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
_MANGLE_RE = re.compile("|".join(re.escape(k) for k in _MANGLE))


class GenerationError(RuntimeError):
    """No solvable game was found for a seed within the retry budget."""


@dataclass(frozen=True)
class TaskSpec:
    """What a generated game asks for (stored in the game file under ``crl``)."""

    task_type: str
    object_target: str
    parent_target: str
    toggle_target: str
    floor_plan: int
    goal_text: str
    seed: int
    generator_version: int = GENERATOR_VERSION

    def to_json(self) -> dict:
        return asdict(self)


def mangle(thor_id: str) -> str:
    """AI2-THOR id -> PDDL name, as ALFWorld does (``Sink|+00.1|x`` -> ``Sink_bar__plus_00_dot_1_bar_x``)."""
    return _MANGLE_RE.sub(lambda m: _MANGLE[m.group(0)], thor_id)


@functools.lru_cache(maxsize=1)
def shipped_logic() -> tuple[str, str]:
    """(PDDL domain, TWL2 grammar) exactly as the alfworld wheel ships them."""
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    with open(ALFRED_PDDL_PATH) as f:
        domain = f.read()
    with open(ALFRED_TWL2_PATH) as f:
        grammar = f.read()
    return domain, grammar


def _goal_library() -> dict:
    import alfworld.gen.goal_library as glib

    return glib.gdict


def _choose_task(task_type: str, rng: np.random.Generator) -> tuple[int, str, str, str]:
    """(floor plan, object class, receptacle class, lamp class) for a task type."""
    import alfworld.gen.constants as constants

    rooms = tuple(sorted(constants.GOALS_VALID[task_type]))
    plans = sc.floor_plans(rooms)
    pickupable = sc.pickupable_classes()
    static = sc.static_receptacle_classes()
    for _ in range(200):
        plan = plans[int(rng.integers(len(plans)))]
        classes, points, _ = sc.floor_plan_data(plan)
        present = set(classes)
        recep_classes = sorted(present & static)
        toggle = ""
        candidates = sorted(present & pickupable)
        if task_type in _APPLIANCE:
            appliance, kind = _APPLIANCE[task_type]
            if appliance not in present:
                continue
            candidates = sorted(set(candidates) & sc.action_classes(kind))
            recep_classes = [r for r in recep_classes if r != appliance]
        if task_type == "look_at_obj_in_light":
            lamps = sorted(present & set(sc.LAMPS))
            if not lamps or not (present & set(sc.LAMP_STANDS)):
                continue
            toggle = lamps[int(rng.integers(len(lamps)))]
        if not candidates:
            continue
        obj = candidates[int(rng.integers(len(candidates)))]
        if task_type == "look_at_obj_in_light":
            return plan, obj, "", toggle
        # A goal receptacle class, and another class the object can start in.
        holders = [r for r in recep_classes if sc.can_contain(r, obj)]
        if len(holders) < 2:
            continue
        recep = holders[int(rng.integers(len(holders)))]
        return plan, obj, recep, toggle
    raise GenerationError(f"no floor plan fits a {task_type} task")


def build_problem(task_type: str, seed: int, attempt: int = 0) -> tuple[TaskSpec, str]:
    """The task and its PDDL problem text for a seed (deterministic; no planner involved).

    ``attempt`` > 0 draws another scene for the same seed (used when the planner rejects one).
    """
    if task_type not in TASK_TYPES:
        raise ValueError(f"unknown ALFWorld task type {task_type!r}; use one of {', '.join(TASK_TYPES)}")
    rng = np.random.default_rng([int(seed), TASK_TYPES.index(task_type), GENERATOR_VERSION, int(attempt)])
    for _ in range(50):
        plan, obj, recep, toggle = _choose_task(task_type, rng)
        forbidden: dict[str, set[str]] = {}
        if recep:
            forbidden[obj] = {recep}
        if task_type == "pick_cool_then_place_in_recep":
            forbidden.setdefault(obj, set()).add("Fridge")  # ALFWorld counts objects in the fridge as cool
        need = 2 if task_type == "pick_two_obj_and_place" else 1
        scene = sc.build_scene(plan, rng, extra_instances={obj: need}, forbidden=forbidden)
        if len(scene.objects_of(obj)) < need or (toggle and not scene.objects_of(toggle)):
            continue
        if recep and not scene.receptacles_of(recep):
            continue
        templates = _goal_library()[task_type]["templates"]
        text = templates[int(rng.integers(len(templates)))].format(
            obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower(), mrecep="")
        spec = TaskSpec(task_type, obj, recep, toggle, plan, text, int(seed))
        return spec, write_problem(spec, scene)
    raise GenerationError(f"could not build a {task_type} scene for seed {seed}")


def goal_pddl(spec: TaskSpec) -> str:
    """The goal section from alfworld's goal library, with ALFWorld's ``#`` -> ``-`` fix."""
    goal = _goal_library()[spec.task_type]["pddl"].format(
        obj=spec.object_target, recep=spec.parent_target, toggle=spec.toggle_target, mrecep="")
    return goal.replace("#", "-")


def write_problem(spec: TaskSpec, scene: sc.Scene) -> str:
    """The PDDL problem for a scene and task, in ALFWorld's layout."""
    constants_ = sc._constants()
    objs = scene.objects
    otypes = sorted({o.cls for o in objs} | {spec.object_target} | set(_DOMAIN_OTYPES)
                    | ({spec.toggle_target} if spec.toggle_target else set()))
    rtypes = sorted({r.cls for r in scene.receptacles} | set(_DOMAIN_RTYPES)
                    | ({spec.parent_target} if spec.parent_target else set()))
    locations = sorted({r.location for r in scene.receptacles} | {scene.agent_location})
    recep_loc = {r.id: r.location for r in scene.receptacles}
    cleanable, heatable = sc.action_classes("Cleanable"), sc.action_classes("Heatable")
    coolable, sliceable = sc.action_classes("Coolable"), sc.action_classes("Sliceable")
    openable = sc.openable_classes()
    m = mangle
    lines = [f"(define (problem plan_crl_{spec.task_type}_{spec.seed})", "(:domain alfred)", "(:objects",
             "agent1 - agent"]
    lines += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    lines += [f"{m(o.id)} - object" for o in objs]
    lines += [f"{m(r.id)} - receptacle" for r in scene.receptacles]
    lines += [f"{m(loc)} - location" for loc in locations]
    lines += [")", "(:init"]
    lines += [f"(receptacleType {m(r.id)} {r.cls}Type)" for r in scene.receptacles]
    lines += [f"(objectType {m(o.id)} {o.cls}Type)" for o in objs]
    lines += [f"(canContain {rt}Type {ot}Type)" for rt in rtypes for ot in otypes if sc.can_contain(rt, ot)]
    lines += [f"(openable {m(r.id)})" for r in scene.receptacles if r.cls in openable]
    lines += [f"(atLocation agent1 {m(scene.agent_location)})"]
    for o in objs:
        if o.cls in sc.LAMPS:
            lines.append(f"(toggleable {m(o.id)})")
            continue
        lines.append(f"(pickupable {m(o.id)})")
        if o.cls in constants_.MOVABLE_RECEPTACLES_SET:
            lines.append(f"(isReceptacleObject {m(o.id)})")
        for cls_set, pred in ((cleanable, "cleanable"), (heatable, "heatable"), (coolable, "coolable"),
                              (sliceable, "sliceable")):
            if o.cls in cls_set:
                lines.append(f"({pred} {m(o.id)})")
    for o in objs:
        lines.append(f"(inReceptacle {m(o.id)} {m(o.receptacle)})")
        lines.append(f"(objectAtLocation {m(o.id)} {m(recep_loc[o.receptacle])})")
    lines += [f"(receptacleAtLocation {m(r.id)} {m(r.location)})" for r in scene.receptacles]
    lines.append(")")
    return "\n".join(lines) + "\n" + goal_pddl(spec)


def game_data(spec: TaskSpec, problem: str) -> dict:
    """The ``game.tw-pddl`` dict (not yet verified: ``solvable`` is ``None``)."""
    domain, grammar = shipped_logic()
    return {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", spec.goal_text),
        "pddl_problem": problem,
        "solvable": None,
        "walkthrough": None,
        "crl": spec.to_json(),
    }
