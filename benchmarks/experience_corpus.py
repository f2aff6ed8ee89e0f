"""A generated corpus of experience-bank-like entries and actor queries, and its MiniLM embeddings.

The search benchmark needs real sentence embeddings of varied text, at up to 100k entries, and
no data set can be downloaded. So the text is generated: lessons in the form the extractor writes
(a short title, then "when <situation>, <do this> because <reason>"), drawn from per-family
vocabularies (Sokoban, MiniHack, ALFWorld, WebShop, SWE, plus a few generic text-game and tool-use
families) with many sentence templates, and queries in the form an actor searches with (a goal, a
question, a piece of the current observation). Every entry is distinct text; many are close
paraphrases of each other, as in a real bank before its merges, which is what makes the
nearest-neighbour graph hard (dense clusters), unlike random vectors.

The texts are embedded with the packaged all-MiniLM-L6-v2 (the bank's default embedder) and the
vectors are cached as ``.npy`` under ``$CRL_CACHE/experience-bench`` (default
``~/.cache/crl-bench``), in chunks, so an interrupted run resumes where it stopped.

What the corpus is, honestly: embedding 100k lessons takes 10 minutes on 2 idle cores and far
longer on a busy machine, so only the first ``real`` lessons (default 20,480) are embedded; the
rest of a larger corpus are *composites*: the normalised sum of the vectors of two real lessons of
the same family, standing for a lesson that joins the two (MiniLM mean-pools its tokens, so the
embedding of a joined text lies near the mean of its parts; ``--check-composites`` embeds such
joined texts and reports how near). Composites sit between existing lessons, which makes the
neighbourhoods denser, so they are a harder case for the graph than more real lessons would be.

Run: ``python benchmarks/experience_corpus.py`` (fills the cache; prints samples).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

import numpy as np

# Bump when the generator changes: cached vectors of another version are not reused.
CORPUS_VERSION = 1

FAMILIES: dict[str, dict[str, list[str]]] = {
    "sokoban": {
        "thing": ["the box", "a box", "the second box", "the last box", "two boxes", "the box next to the wall",
                  "the box in the corridor", "the box near the goal", "the corner box", "the stuck box"],
        "place": ["the north wall", "the south wall", "the east wall", "the west wall", "a corner", "a goal square",
                  "the narrow corridor", "the centre of the room", "the doorway", "the edge of the grid",
                  "the top-left corner", "the bottom-right corner", "an open square", "the dead end"],
        "act": ["push it east", "push it west", "push it north", "push it south", "walk around it first",
                "step back and approach from the other side", "clear the corridor before pushing",
                "plan the pushes backwards from the goal", "count the free squares behind it",
                "move the player to the far side", "undo the last push mentally before committing",
                "push the nearer box first", "leave a gap to walk through", "line the boxes up along the wall"],
        "why": ["a box in a corner can never be moved again", "a box against a wall can only slide along it",
                "the player cannot pull boxes", "two boxes side by side block each other",
                "the corridor is one square wide", "the episode ends after the step limit",
                "invalid moves waste steps", "the goal squares are all on one side"],
        "goal": ["push every box onto a goal", "solve the 6x6 puzzle with one box", "solve the 7x7 puzzle with two boxes",
                 "place the boxes on the marked squares", "finish the level in few steps"],
    },
    "minihack": {
        "thing": ["the locked door", "the key", "a potion", "the wand", "the lava", "a monster", "the goblin",
                  "the jackal", "a newt", "the stairs down", "a boulder", "the fountain", "a ring", "the corridor",
                  "the dark room", "a trap", "the river", "the scroll", "an amulet", "the closed door"],
        "place": ["the room to the east", "the far corner", "the next level", "the maze", "the narrow bridge",
                  "the room entrance", "a dead-end corridor", "the lit area", "the unexplored west side"],
        "act": ["kick it open", "pick up the key and apply it", "quaff the potion", "zap the wand at it",
                "levitate over it", "fight it in the corridor", "throw daggers at it", "search for hidden passages",
                "go around the long way", "read the scroll first", "put on the ring", "wait for it to come closer",
                "descend the stairs with '>'", "open the door with 'o' and a direction", "eat only fresh corpses",
                "check the inventory with 'i'", "move diagonally to dodge"],
        "why": ["lava kills instantly", "the door is locked and kicking can take many tries",
                "the monster is faster than you", "unidentified potions can be harmful", "the wand has few charges",
                "levitation lets you cross water and lava", "hidden doors show up only after searching",
                "the message line says what happened", "hunger grows with every turn"],
        "goal": ["reach the stairs down", "cross the lava river", "escape the room with the locked door",
                 "find the key and open the door", "survive the monster and reach the goal", "navigate the maze"],
    },
    "alfworld": {
        "thing": ["the mug", "a plate", "the apple", "the knife", "a cd", "the book", "a pillow", "the soap bar",
                  "a lettuce", "the tomato", "a potato", "the egg", "a spoon", "the keychain", "a vase", "the cellphone",
                  "the pencil", "a towel", "the remote control", "a bowl", "the pan", "a candle", "the watch"],
        "place": ["the countertop", "the fridge", "the microwave", "the sinkbasin", "the cabinet", "the drawer",
                  "the shelf", "the desk", "the sidetable", "the dresser", "the garbagecan", "the stoveburner",
                  "the coffeemachine", "the bed", "the sofa", "the toilet", "the bathtubbasin", "the safe"],
        "act": ["open the receptacle before looking inside", "take it and go to the sinkbasin to clean it",
                "heat it with the microwave", "cool it with the fridge", "use the desklamp to examine it",
                "check every drawer in order", "look on the countertops first", "put it in before taking the second one",
                "go to the place and then take the object", "close the fridge only after taking the item",
                "examine the object under the lamp", "carry one object at a time"],
        "why": ["closed receptacles hide their contents", "the task checks the object's state, not just its place",
                "objects of that kind are usually kept there", "you can hold only one object",
                "the admissible actions list names the exact object ids", "cleaning needs the sinkbasin",
                "the episode ends after fifty steps"],
        "goal": ["put a clean mug in the coffeemachine", "heat an egg and put it on the countertop",
                 "put two cds in the safe", "examine the book with the desklamp", "cool a tomato and put it in the microwave",
                 "put a soap bar in the garbagecan", "find a pencil and place it on the desk"],
    },
    "webshop": {
        "thing": ["the search query", "the product page", "the size option", "the colour option", "the price filter",
                  "the first result", "the item description", "the buy now button", "the next page", "the review count",
                  "the attribute list", "the pack quantity", "the brand name"],
        "place": ["the results list", "page two of the results", "the options panel", "the item detail view",
                  "the top of the page", "the back to search link"],
        "act": ["search with the key attributes only", "drop adjectives that are not in the catalogue",
                "click the size before the colour", "compare the price with the budget before buying",
                "open the first three results", "go back to search when no result matches",
                "include the product type in the query", "pick the option that matches the instruction exactly",
                "read the description for the material", "prefer items under the price limit"],
        "why": ["the reward counts matched attributes and price", "long queries return fewer relevant items",
                "unselected options score zero", "buying ends the episode", "the catalogue uses short product titles",
                "results are ranked by keyword overlap"],
        "goal": ["buy a men's cotton t-shirt in large under 30 dollars", "find a gluten-free snack pack of 12",
                 "buy a wireless mouse in black under 20 dollars", "find a queen size bed sheet set in grey",
                 "buy a women's running shoe size 8 in blue", "find vegan protein powder under 40 dollars"],
    },
    "swe": {
        "thing": ["the failing test", "the traceback", "the import error", "the off-by-one", "the None check",
                  "the regex", "the config parser", "the date parsing", "the unicode handling", "the cache key",
                  "the recursion limit", "the file path", "the encoding", "the type annotation", "the deprecation warning",
                  "the mutable default argument", "the race condition", "the integer overflow"],
        "place": ["the utils module", "the models file", "the test suite", "the setup.py", "the CLI entry point",
                  "the serializer", "the query builder", "the template renderer", "the migration", "the parser module"],
        "act": ["run the single failing test with pytest -x", "grep for the function name", "read the whole function before editing",
                "reproduce the bug with a tiny script", "add a regression test first", "check git log for the file",
                "use sed to patch one line", "print the intermediate values", "check the edge case of an empty list",
                "keep the public signature unchanged", "run the neighbouring tests too", "look for a similar fix elsewhere"],
        "why": ["the grader runs the hidden tests", "editing the wrong copy of the file changes nothing",
                "a broad except hides the real error", "the bug only shows with non-ASCII input",
                "the fix must not break other callers", "the sandbox has no network"],
        "goal": ["fix the failing test in the date parser", "make the serializer accept None",
                 "fix the crash on empty input", "resolve the import cycle", "fix the wrong rounding in the report"],
    },
    "textgame": {
        "thing": ["the lamp", "the brass key", "the troll", "the mailbox", "the leaflet", "the rope", "the trapdoor",
                  "the sword", "the chest", "the guard", "the bridge", "the torch", "the map", "the coin"],
        "place": ["the cellar", "the attic", "the forest path", "the cave entrance", "the kitchen", "the living room",
                  "the riverbank", "the tower", "the garden", "the clearing"],
        "act": ["examine everything in the room", "take the lamp before going down", "turn on the lamp", "give it the coin",
                "tie the rope to the railing", "read the leaflet", "go back the way you came", "save before the fight",
                "open it with the key", "wait one turn and look again"],
        "why": ["dark places kill you without a light", "the parser understands only verb-noun commands",
                "some objects appear only after examining", "the score rises when you reach a new room",
                "the guard blocks the way until paid"],
        "goal": ["find the treasure in the cellar", "cross the bridge past the troll", "light the way into the cave",
                 "get into the house", "escape from the tower"],
    },
    "tooluse": {
        "thing": ["the calculator result", "the API response", "the search result", "the unit conversion",
                  "the date difference", "the table lookup", "the JSON field", "the missing argument", "the rate limit"],
        "place": ["the first tool call", "the final answer", "the scratchpad", "the tool list", "the error message"],
        "act": ["check the units before answering", "call the search tool with a narrower query",
                "parse the JSON before reading the field", "retry once after a timeout", "state the answer in one line",
                "use the calculator for every multiplication", "read the tool's argument schema"],
        "why": ["free-text arithmetic is often wrong", "the checker compares exact strings",
                "tools fail on malformed arguments", "the budget of tool calls is small"],
        "goal": ["answer the question with the tools", "compute the total cost", "find the date of the event",
                 "convert the measurement", "look up the population"],
    },
}

OPENERS = ["When", "If", "Whenever", "Once", "As soon as", "Before", "After", "Every time", "In levels where", "Where"]
SITUATIONS = [
    "{thing} is next to {place}", "you see {thing} near {place}", "{thing} blocks {place}", "{thing} is in {place}",
    "you reach {place} and {thing} is there", "the observation mentions {thing}", "{thing} has not been found yet",
    "you stand beside {thing}", "{thing} appears after {n} steps", "you tried {place} {n} times without luck",
    "{thing} and {place} are both visible", "the last action on {thing} failed",
]
ADVICE = [
    "{act}", "{act}, then {act2}", "first {act}, and only then {act2}", "do not rush: {act}", "always {act}",
    "it works to {act}", "{act} instead of {act2}", "never skip this: {act}",
]
REASONS = ["because {why}", "since {why}", "({why})", "as {why}", "-- {why}", "; otherwise it fails, as {why}", ""]
TITLES = [
    "{Thing} near {place}", "Handling {thing}", "{Act}", "Lesson: {thing}", "Tip for {goal}", "Avoid failing at {place}",
    "What to do with {thing}", "{Thing}: {act}", "Order of moves at {place}", "Step {n}: {act}",
]
QUERIES = [
    "how do I {goal}?", "goal: {goal}. what should I do about {thing}?", "{thing} is next to {place}, what now?",
    "I keep failing near {place}", "observation: you see {thing}. {thing2} is in {place}. task: {goal}",
    "what works when {thing} blocks {place}?", "tips for {goal}", "last action failed: {act}",
    "Task: {goal}. Step {n}. You are at {place}.", "is it safe to {act}?",
]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _fill(tpl: str, fam: dict[str, list[str]], rng: np.random.Generator) -> str:
    def pick(key: str) -> str:
        return str(fam[key][rng.integers(len(fam[key]))])

    vals = {
        "thing": pick("thing"), "thing2": pick("thing"), "place": pick("place"), "act": pick("act"),
        "act2": pick("act"), "why": pick("why"), "goal": pick("goal"), "n": str(int(rng.integers(2, 40))),
    }
    vals.update(Thing=_cap(vals["thing"]), Act=_cap(vals["act"]))
    return tpl.format(**vals)


def _choice(items: list[str], rng: np.random.Generator) -> str:
    return items[int(rng.integers(len(items)))]


def entries(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """``n`` distinct ``(family, title, content)`` lessons."""
    rng = np.random.default_rng(seed)
    names = list(FAMILIES)
    out, seen = [], set()
    while len(out) < n:
        family = _choice(names, rng)
        fam = FAMILIES[family]
        title = _fill(_choice(TITLES, rng), fam, rng)
        sentences = []
        for _ in range(int(rng.integers(1, 3))):
            situation = _fill(_choice(SITUATIONS, rng), fam, rng)
            advice = _fill(_choice(ADVICE, rng), fam, rng)
            reason = _fill(_choice(REASONS, rng), fam, rng)
            sentences.append(f"{_choice(OPENERS, rng)} {situation}, {advice} {reason}".strip() + ".")
        content = " ".join(sentences)
        if (title, content) not in seen:
            seen.add((title, content))
            out.append((family, title, content))
    return out


def queries(n: int, seed: int = 1) -> list[str]:
    """``n`` actor queries over the same families (another seed than the entries)."""
    rng = np.random.default_rng(seed)
    names = list(FAMILIES)
    return [_fill(_choice(QUERIES, rng), FAMILIES[_choice(names, rng)], rng) for _ in range(n)]


def cache_dir() -> Path:
    """``$CRL_CACHE/experience-bench`` (default ``~/.cache/crl-bench/experience-bench``)."""
    return Path(os.environ.get("CRL_CACHE") or Path.home() / ".cache" / "crl-bench") / "experience-bench"


def embed_cached(texts: list[str], tag: str, chunk: int = 2048, verbose: bool = True) -> np.ndarray:
    """MiniLM vectors of ``texts``, cached under :func:`cache_dir` by a hash of the texts.

    Chunks are saved as they finish, so an interrupted call resumes; the chunks are joined into
    one ``.npy`` at the end.
    """
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    folder = cache_dir()
    final = folder / f"{tag}-v{CORPUS_VERSION}-{len(texts)}-{digest}.npy"
    if final.exists():
        return np.load(final)
    parts = folder / f"{final.stem}.parts"
    parts.mkdir(parents=True, exist_ok=True)
    from crl_agent.experience.embedder import SentenceTransformerEmbedder

    embedder = None
    t0, done = time.perf_counter(), 0
    chunks = []
    for start in range(0, len(texts), chunk):
        part = parts / f"{start:08d}.npy"
        if part.exists():
            chunks.append(np.load(part))
            continue
        if embedder is None:
            embedder = SentenceTransformerEmbedder()
        vecs = embedder.embed(texts[start : start + chunk]).astype(np.float32)
        tmp = part.with_suffix(".tmp.npy")
        np.save(tmp, vecs)
        os.replace(tmp, part)
        chunks.append(vecs)
        done += len(vecs)
        if verbose:
            rate = done / (time.perf_counter() - t0)
            print(f"  embedded {start + len(vecs):,}/{len(texts):,} ({rate:.0f}/s)", file=sys.stderr, flush=True)
    out = np.concatenate(chunks) if chunks else np.zeros((0, 384), dtype=np.float32)
    tmp = final.with_suffix(".tmp.npy")
    np.save(tmp, out)
    os.replace(tmp, final)
    for p in parts.glob("*.npy"):
        p.unlink()
    parts.rmdir()
    return out


def _entry_text(entry: tuple[str, str, str]) -> str:
    return f"{entry[1]}\n{entry[2]}"  # as the bank embeds an entry


def _cached_sizes(tag: str) -> list[int]:
    """Sizes of the cached vector files of ``tag`` at this corpus version, largest first."""
    sizes = []
    for f in cache_dir().glob(f"{tag}-v{CORPUS_VERSION}-*-*.npy"):
        size = f.stem.split("-")[2]
        if size.isdigit():
            sizes.append(int(size))
    return sorted(sizes, reverse=True)


def _prefix(make, n: int, tag: str, text) -> tuple[list, np.ndarray]:
    """The first ``n`` items of ``make(size)`` and their vectors, sliced from a larger cached run
    when one exists (the generators are deterministic, so a larger run starts with the smaller one)."""
    for size in [s for s in _cached_sizes(tag) if s > n]:
        items = make(size)
        digest = hashlib.sha256("\x00".join(text(i) for i in items).encode()).hexdigest()[:16]
        path = cache_dir() / f"{tag}-v{CORPUS_VERSION}-{size}-{digest}.npy"
        if path.exists():
            return items[:n], np.load(path, mmap_mode="r")[:n].copy()
    items = make(n)
    return items, embed_cached([text(i) for i in items], tag)


REAL = 20_480


def composites(es: list[tuple[str, str, str]], ev: np.ndarray, n: int, seed: int = 2
               ) -> tuple[list[tuple[str, str, str]], np.ndarray, np.ndarray]:
    """``n`` composite lessons: two real lessons ``a != b`` of one family, vector ``normalise(va + vb)``.

    Returns the entries, their vectors and the ``(a, b)`` index pairs.
    """
    rng = np.random.default_rng(seed)
    members: dict[str, list[int]] = {}
    for i, (fam, _, _) in enumerate(es):
        members.setdefault(fam, []).append(i)
    by_family = {f: np.array(ix) for f, ix in members.items()}
    a = rng.integers(len(es), size=n)
    pairs = np.empty((n, 2), dtype=np.int64)
    for j, i in enumerate(a):
        pool = by_family[es[i][0]]
        b = i
        while b == i:
            b = int(pool[rng.integers(len(pool))])
        pairs[j] = (i, b)
    vecs = ev[pairs[:, 0]] + ev[pairs[:, 1]]
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    joined = [(es[i][0], es[i][1], f"{es[i][2]} {es[b][2]}") for i, b in pairs]
    return joined, vecs.astype(np.float32), pairs


def corpus(n: int, n_queries: int, seed: int = 0, real: int = REAL
           ) -> tuple[list[tuple[str, str, str]], np.ndarray, list[str], np.ndarray]:
    """``n`` entries (the first ``min(n, real)`` embedded, the rest composites), their vectors, queries and theirs."""
    es, ev = _prefix(lambda size: entries(size, seed), min(n, real), "entries", _entry_text)
    if n > len(es):
        more, mv, _ = composites(es, ev, n - len(es), seed + 2)
        es, ev = es + more, np.concatenate([ev, mv])
    qs, qv = _prefix(lambda size: queries(size, seed + 1), n_queries, "queries", str)
    return es, ev, qs, qv


def check_composites(n: int = 200, seed: int = 0, real: int = REAL) -> None:
    """Embed ``n`` joined texts and compare them with their composite vectors."""
    from crl_agent.experience.embedder import SentenceTransformerEmbedder

    es, ev = _prefix(lambda size: entries(size, seed), real, "entries", _entry_text)
    joined, cv, pairs = composites(es, ev, n, seed + 2)
    true = SentenceTransformerEmbedder().embed([_entry_text(e) for e in joined])
    cos = np.sum(true * cv, axis=1)
    parts = np.minimum(np.sum(true * ev[pairs[:, 0]], axis=1), np.sum(true * ev[pairs[:, 1]], axis=1))
    print(f"composite vs embedding of the joined text: cosine mean {cos.mean():.3f}, min {cos.min():.3f} "
          f"(the joined text vs the farther of its two parts: mean {parts.mean():.3f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--real", type=int, default=REAL, help="lessons embedded for real; the rest are composites")
    p.add_argument("--check-composites", action="store_true", help="how near composites are to real embeddings")
    args = p.parse_args()
    if args.check_composites:
        check_composites(real=args.real)
        return
    es, ev, qs, _ = corpus(args.entries, args.queries, real=args.real)
    print(f"{len(es):,} entries, {ev.shape} vectors cached in {cache_dir()}")
    for fam, title, content in es[:5]:
        print(f"[{fam}] {title}\n    {content}")
    for q in qs[:5]:
        print(f"query: {q}")


if __name__ == "__main__":
    main()
