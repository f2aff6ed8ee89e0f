"""A task-aware planner for the six ALFWorld task types, over the engine's PDDL facts.

Fast Downward (TextWorld's ``policy_commands``) is exact but slow on realistic scenes: a kitchen
with a dozen closed cabinets and drawers takes from 10 s to several minutes per plan. With full
knowledge of the state, each ALFWorld task has a direct plan: put down what you hold if it is
in the way, fetch a target object (opening its receptacle), clean/heat/cool it at the sink,
microwave or fridge, and put it in a goal receptacle (opening that), or, for look-at-in-light,
carry it to the lamp and switch it on. :func:`plan_commands` writes that plan from the facts of
the current state, in milliseconds, and it is used twice:

* at generation, where the plan is replayed in TextWorld and must win (that is the solvability
  proof stored with the game);
* by the oracle, when the agent left the stored plan: re-plan from the current facts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

_TREATMENT = {"pick_clean_then_place_in_recep": ("clean", "isclean", "sinkbasintype"),
              "pick_heat_then_place_in_recep": ("heat", "ishot", "microwavetype"),
              "pick_cool_then_place_in_recep": ("cool", "iscool", "fridgetype")}


@dataclass
class Goal:
    """What a game asks for, by class (``Apple``, ``CounterTop``, ``DeskLamp``)."""

    task_type: str
    object_target: str
    parent_target: str = ""
    toggle_target: str = ""

    @classmethod
    def from_params(cls, task_type: str, params: dict[str, Any]) -> Goal:
        return cls(task_type, str(params.get("object_target") or ""), str(params.get("parent_target") or ""),
                   str(params.get("toggle_target") or ""))


@dataclass
class _State:
    names: dict[str, str]
    agent_loc: str = ""
    holding: str | None = None
    recep_loc: dict[str, str] = field(default_factory=dict)
    in_recep: dict[str, str] = field(default_factory=dict)
    otype: dict[str, str] = field(default_factory=dict)
    rtype: dict[str, str] = field(default_factory=dict)
    openable: set[str] = field(default_factory=set)
    opened: set[str] = field(default_factory=set)
    can_contain: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    flags: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    pickupable: set[str] = field(default_factory=set)


def _read_state(facts, names: dict[str, str]) -> _State:
    s = _State(names)
    for f in facts:
        args = [a.name for a in f.arguments]
        n = f.name
        if n == "atlocation":
            s.agent_loc = args[1]
        elif n == "holds":
            s.holding = args[1]
        elif n == "receptacleatlocation":
            s.recep_loc[args[0]] = args[1]
        elif n == "inreceptacle":
            s.in_recep[args[0]] = args[1]
        elif n == "objecttype":
            s.otype[args[0]] = args[1]
        elif n == "receptacletype":
            s.rtype[args[0]] = args[1]
        elif n == "openable":
            s.openable.add(args[0])
        elif n == "opened":
            s.opened.add(args[0])
        elif n == "cancontain":
            s.can_contain[args[0]].add(args[1])
        elif n == "pickupable":
            s.pickupable.add(args[0])
        elif n in ("isclean", "ishot", "iscool", "istoggled"):
            s.flags[n].add(args[0])
    return s


class _Planner:
    def __init__(self, s: _State, goal: Goal):
        self.s, self.goal, self.out = s, goal, []
        self.obj_t = goal.object_target.lower() + "type"
        self.recep_t = goal.parent_target.lower() + "type"
        self.only: str | None = None  # pick-two: the one goal receptacle both objects go to

    def name(self, entity: str) -> str:
        return self.s.names.get(entity, entity).strip()

    def go(self, r: str) -> None:
        if self.s.agent_loc != self.s.recep_loc[r]:
            self.out.append(f"go to {self.name(r)}")
            self.s.agent_loc = self.s.recep_loc[r]

    def reach(self, r: str) -> None:
        """Go to ``r`` and open it if it is closed."""
        self.go(r)
        if r in self.s.openable and r not in self.s.opened:
            self.out.append(f"open {self.name(r)}")
            self.s.opened.add(r)

    def cost(self, r: str) -> int:
        return (self.s.agent_loc != self.s.recep_loc.get(r)) + (r in self.s.openable and r not in self.s.opened)

    def put(self, o: str, r: str) -> None:
        self.reach(r)
        self.out.append(f"move {self.name(o)} to {self.name(r)}")
        self.s.in_recep[o], self.s.holding = r, None

    def take(self, o: str) -> None:
        r = self.s.in_recep[o]
        self.reach(r)
        self.out.append(f"take {self.name(o)} from {self.name(r)}")
        del self.s.in_recep[o]
        self.s.holding = o

    def best(self, receps: list[str]) -> str | None:
        return min(receps, key=lambda r: (self.cost(r), self.name(r)), default=None)

    def receptacles(self, rtype: str) -> list[str]:
        return [r for r, t in self.s.rtype.items() if t == rtype and r in self.s.recep_loc]

    def put_down(self) -> bool:
        o = self.s.holding
        ok = [r for r, t in self.s.rtype.items() if self.s.otype.get(o) in self.s.can_contain.get(t, ())
              and r in self.s.recep_loc and t != self.recep_t]
        r = self.best(ok)
        if r is None:
            return False
        self.put(o, r)
        return True

    def in_goal(self, o: str) -> bool:
        if self.only is not None:
            return self.s.in_recep.get(o) == self.only
        return self.s.rtype.get(self.s.in_recep.get(o, "")) == self.recep_t

    def fetch(self, exclude_in_goal: bool) -> str | None:
        """Hold a target object (keep one already held); return it."""
        h = self.s.holding
        if h is not None and self.s.otype.get(h) == self.obj_t:
            return h
        if h is not None and not self.put_down():
            return None
        candidates = [o for o, t in self.s.otype.items()
                      if t == self.obj_t and o in self.s.in_recep and o in self.s.pickupable
                      and not (exclude_in_goal and self.in_goal(o))]
        treated = _TREATMENT.get(self.goal.task_type, ("", "", ""))[1]
        o = min(candidates, key=lambda o: (o not in self.s.flags[treated], self.cost(self.s.in_recep[o]),
                                           self.name(o)), default=None)
        if o is not None:
            self.take(o)
        return o

    def solve(self) -> list[str] | None:
        g = self.goal.task_type
        if g == "look_at_obj_in_light":
            return self.solve_look()
        done = [o for o in self.s.in_recep if self.s.otype.get(o) == self.obj_t and self.in_goal(o)
                and (g not in _TREATMENT or o in self.s.flags[_TREATMENT[g][1]])]
        if done and g != "pick_two_obj_and_place":
            return self.out
        goal_receps = self.receptacles(self.recep_t)
        if not goal_receps:
            return None
        # Pick-two wants both objects in the *same* receptacle: prefer one that already holds some.
        r = min(goal_receps, key=lambda r: (-sum(self.s.in_recep.get(o) == r for o in done), self.cost(r),
                                            self.name(r)))
        need = 1
        if g == "pick_two_obj_and_place":
            need, self.only = 2 - sum(self.s.in_recep.get(o) == r for o in done), r
        for _ in range(need):
            o = self.fetch(exclude_in_goal=True)
            if o is None:
                return None
            if g in _TREATMENT:
                verb, flag, appliance_t = _TREATMENT[g]
                if o not in self.s.flags[flag]:
                    a = self.best(self.receptacles(appliance_t))
                    if a is None:
                        return None
                    self.go(a)
                    self.out.append(f"{verb} {self.name(o)} with {self.name(a)}")
                    self.s.flags[flag].add(o)
            if g != "pick_two_obj_and_place":
                r = self.best(goal_receps)
            self.put(o, r)
        return self.out

    def solve_look(self) -> list[str] | None:
        if self.fetch(exclude_in_goal=False) is None:
            return None
        lamp_t = self.goal.toggle_target.lower() + "type"
        lamps = [o for o, t in self.s.otype.items() if t == lamp_t and o in self.s.in_recep]
        lamp = min(lamps, key=lambda o: (self.cost(self.s.in_recep[o]), self.name(o)), default=None)
        if lamp is None:
            return None
        self.go(self.s.in_recep[lamp])
        if lamp not in self.s.flags["istoggled"]:
            self.out.append(f"use {self.name(lamp)}")
        return self.out


def plan_commands(facts, names: dict[str, str], goal: Goal) -> list[str] | None:
    """Commands that reach ``goal`` from the state given by ``facts``, or ``None`` if none found.

    Args:
        facts: the engine's current facts (``PddlState.facts``: propositions over PDDL names).
        names: PDDL name -> displayed name (``sinkbasin 1``), as the demangler set them.
        goal: the task.
    """
    return _Planner(_read_state(facts, names), goal).solve()


DYNAMIC = frozenset({"atlocation", "holds", "inreceptacle", "opened", "isclean", "ishot", "iscool", "istoggled"})


def read_state(pddl_env, predicates: frozenset[str] | None = None) -> _State:
    """The facts of a live ``textworld.envs.PddlEnv`` that the planner and progress read.

    ``predicates`` restricts the read to some predicates (e.g. :data:`DYNAMIC`, which skips the
    hundreds of static facts).
    """
    names = {k: info.name for k, info in pddl_env._entity_infos.items()}
    groups = pddl_env._pddl_state._facts.items()
    facts = (f for sig, fs in groups if predicates is None or sig.name in predicates for f in fs)
    return _read_state(facts, names)


def plan_from_engine(pddl_env, goal: Goal) -> list[str] | None:
    """:func:`plan_commands` on a live ``textworld.envs.PddlEnv``."""
    return _Planner(read_state(pddl_env), goal).solve()
