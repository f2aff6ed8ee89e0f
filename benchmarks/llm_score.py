"""Action scoring with the embedded SmolLM2-135M: step latency with and without the prefix cache, fp32 vs bf16.

Each episode is a scripted 30-turn MiniHack-like conversation: a fixed system prompt, then per turn
a user message carrying the full map and message line; the policy scores the 8 compass moves
(``LLM.score``) and takes the argmax, which goes into the history as the assistant's reply. Older
turns stay in the chat compactly (``--history compact``: the action and a one-line feedback, as an
agent with compact prompts sends them; the latest observation is always in full), or in full
(``--history full``). The observations do not depend on the actions, so every configuration does
the same work.

Measured in the same run, against the baseline of fp32 without the prefix cache (what the backend
did before it had either):

- median step latency (one ``score`` call of 8 candidates) over the 30 turns, per configuration:
  fp32 / bf16, cache off / on; target <= 0.5 s;
- steps/s of 8 concurrent episodes against 1 episode, in the fastest configuration; target >= 3x;
- the largest difference between bf16 and fp32 candidate log-probs (the documented tolerance).

Threads default to 1 (see benchmarks/llm_batching.py: on a shared CPU two threads spin against
each other); pass ``--threads 2`` on an idle machine. Timings on a shared 2-core machine are noisy.

Run: ``python benchmarks/llm_score.py [--turns 30] [--episodes 8] [--threads 1] [--history compact]``
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from crl_agent.llm.transformers_backend import TransformersLLM

MOVES = ["north", "east", "south", "west", "northeast", "southeast", "southwest", "northwest"]
SYSTEM = (
    "You are an agent playing MiniHack, a roguelike dungeon game, through text. The map is drawn with "
    "characters: '@' is you, '>' is the staircase down (the goal), '.' is floor, '|' and '-' are walls, "
    "'#' is a corridor, '+' is a door. Each turn you receive the map and the game's message line. Reply "
    "with exactly one move from this list and nothing else: " + ", ".join(MOVES) + ". Moving into a wall "
    "wastes a turn. Reach the staircase in as few moves as possible. Think about where the staircase is "
    "relative to you: rows grow downwards and columns grow to the right."
)


def observation(rng: random.Random, turn: int) -> str:
    h, w = 7, 11
    grid = [["." for _ in range(w)] for _ in range(h)]
    for c in range(w):
        grid[0][c] = grid[h - 1][c] = "-"
    for r in range(h):
        grid[r][0] = grid[r][w - 1] = "|"
    ar, ac = rng.randrange(1, h - 1), rng.randrange(1, w - 1)
    sr, sc = rng.randrange(1, h - 1), rng.randrange(1, w - 1)
    grid[sr][sc], grid[ar][ac] = ">", "@"
    rows = "\n".join("".join(r) for r in grid)
    msg = rng.choice(["It's a wall.", "You see here a staircase down.", "", "You hear some noises.",
                      "The door opens.", "You feel a draft."])
    return (f"Turn {turn}. Message: {msg or '(none)'}\nMap:\n{rows}\nYou are at row {ar}, column {ac}. "
            f"The staircase is at row {sr}, column {sc}. Which move?")


async def episode(llm: TransformersLLM, seed: int, turns: int, history: str) -> list[float]:
    """Play one scripted episode; returns the latency of each step."""
    rng = random.Random(seed)
    chat = [{"role": "system", "content": SYSTEM}]
    latencies = []
    for t in range(turns):
        obs = observation(rng, t)
        chat.append({"role": "user", "content": obs})
        t0 = time.perf_counter()
        scores = await llm.score(chat, MOVES)
        latencies.append(time.perf_counter() - t0)
        move = MOVES[max(range(len(MOVES)), key=scores.__getitem__)]
        if history == "compact":
            chat[-1] = {"role": "user", "content": f"Turn {t}: {obs.splitlines()[0].split('Message: ')[1]}"}
        chat.append({"role": "assistant", "content": move})
    return latencies


async def prompt_tokens(llm: TransformersLLM, seed: int, turns: int, history: str) -> int:
    rng = random.Random(seed)
    chat = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        chat.append({"role": "user", "content": observation(rng, t)})
        if t < turns - 1:
            if history == "compact":
                chat[-1] = {"role": "user", "content": f"Turn {t}: compact"}
            chat.append({"role": "assistant", "content": "north"})
    return len(llm.render(chat))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the packaged SmolLM2-135M)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--episodes", type=int, default=8, help="concurrent episodes (default: 8)")
    p.add_argument("--history", choices=["compact", "full"], default="compact")
    args = p.parse_args()

    models = {dt: TransformersLLM(args.model, dtype=dt, num_threads=args.threads, max_batch_size=max(8, args.episodes))
              for dt in ("float32", "bfloat16")}
    print(f"model {models['float32'].model_name}, torch threads {args.threads}, {args.turns} turns, "
          f"history {args.history}; last prompt {asyncio.run(prompt_tokens(models['float32'], 0, args.turns, args.history))} "
          "tokens")

    # bf16 tolerance: the same prompts scored in both dtypes
    async def tolerance() -> tuple[float, float]:
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": observation(random.Random(1), 0)}]
        a = await models["float32"].score_full(chat, MOVES)
        b = await models["bfloat16"].score_full(chat, MOVES)
        diff = [abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)]
        per_tok = [d / n for d, n in zip(diff, a.token_counts, strict=True)]
        return max(diff), max(per_tok)

    worst, worst_tok = asyncio.run(tolerance())
    print(f"bf16 vs fp32 candidate log-probs: max |diff| {worst:.3f} nat ({worst_tok:.3f} nat/token)")

    medians: dict[str, float] = {}
    for dt, llm in models.items():
        for cache in (False, True):
            llm.prefix_cache.clear()
            saved = llm.prefix_cache.max_bytes
            llm.prefix_cache.max_bytes = saved if cache else 0
            lat = asyncio.run(episode(llm, 0, args.turns, args.history))
            llm.prefix_cache.max_bytes = saved
            name = f"{'bf16' if dt == 'bfloat16' else 'fp32'} cache {'on ' if cache else 'off'}"
            medians[name] = statistics.median(lat)
            print(f"{name}: median step {medians[name]:.3f} s (first {lat[0]:.3f} s, last {lat[-1]:.3f} s)")
    base = medians["fp32 cache off"]
    for name, m in medians.items():
        print(f"  {name}: {base / m:5.1f}x faster than fp32 cache off")
    best_name = min(medians, key=medians.get)
    print(f"target median step <= 0.5 s ({best_name}): {'OK' if medians[best_name] <= 0.5 else 'MISSED'}")

    llm = models["bfloat16" if best_name.startswith("bf16") else "float32"]

    async def concurrent(n: int) -> float:
        llm.prefix_cache.clear()
        t0 = time.perf_counter()
        await asyncio.gather(*(episode(llm, 100 + i, args.turns, args.history) for i in range(n)))
        return n * args.turns / (time.perf_counter() - t0)

    one = asyncio.run(concurrent(1))
    before = llm.batch_stats.batches
    many = asyncio.run(concurrent(args.episodes))
    sizes = llm.batch_stats.sizes[before:]
    print(f"{best_name}: 1 episode {one:.2f} steps/s, {args.episodes} concurrent {many:.2f} steps/s "
          f"(mean batch {statistics.mean(sizes):.1f}), ratio {many / one:.2f}x")
    print(f"target >= 3x: {'OK' if many / one >= 3 else 'MISSED'}")
    print(f"prefix cache: {llm.prefix_cache.stats}, {llm.prefix_cache.nbytes / 2**20:.0f} MiB held")


if __name__ == "__main__":
    main()
