"""The hang policy: whether what the watchdog saw (launch/watchdog.py) is a hang, and why.

Pure: a function of the observations of one poll (each rank's silence and last heartbeat,
each server's silence) and the recipe's hang_timeout; the reading of heartbeat files, the
/health probes and /proc are the watchdog's, the stack dumps launch/stacks.py's. The limit:

- `hang_timeout: S` in the recipe: S seconds once a rank has finished its first step;
  before that S + WARMUP_S, a warm-up allowance for what only the first step pays (imports,
  model loading, compilation, CUDA graphs, vLLM's first generation with a cold cache), which
  a limit sized for the steady state does not cover. The server's /health gets S from its
  first healthy answer (server_limit_for).
- unset (auto): AUTO_STARTUP_S while a rank has not finished a step or is saving (model load,
  first generation, NCCL set-up, a big checkpoint), else the larger of AUTO_FLOOR_S and
  AUTO_STEPS x the slowest step any rank reported. The floor covers a long generation phase
  on a GPU; five times the slowest step covers completions growing longer during training.

With several servers (vllm_nodes > 1) the silence is that of the last one to answer: a lost
server being restarted (launch/server_group.py) is no hang while another answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

AUTO_FLOOR_S = 600.0
AUTO_STARTUP_S = 1800.0
AUTO_STEPS = 5
WARMUP_S = 300.0
# Phases before the first step or around a save: the auto limit is AUTO_STARTUP_S there.
SLOW_PHASES = frozenset({None, "built", "train_begin", "save", "saved", "train_end"})


def limit_for(timeout: float | None, phase: str | None, slowest_step_s: float) -> float:
    """Seconds of silence allowed in `phase` (see the module docstring). `phase` None: no
    heartbeat yet; `slowest_step_s` 0: no step finished yet (each process reports its own)."""
    warming_up = phase is None or not slowest_step_s
    if timeout is not None:
        return timeout + WARMUP_S if warming_up else timeout
    if phase in SLOW_PHASES or warming_up:
        return AUTO_STARTUP_S
    return max(AUTO_FLOOR_S, AUTO_STEPS * slowest_step_s)


def server_limit_for(timeout: float | None, slowest_step_s: float) -> float:
    """Seconds without an answer from the vLLM server's /health. Its API process answers
    while the engine compiles (in CI it did through a cold first generation that outlasted
    hang_timeout 15), so an explicit limit gets no warm-up allowance here."""
    return timeout if timeout is not None else limit_for(None, "step_end", slowest_step_s)


@dataclass(frozen=True)
class RankSeen:
    """One rank at one poll."""

    rank: int
    silent_s: float  # since its heartbeat last changed (or since the watch began)
    beat: dict | None = None  # its last heartbeat
    note: str = ""  # what /proc says of its process when that explains a silence


@dataclass(frozen=True)
class Seen:
    """What the watchdog saw at one poll."""

    ranks: tuple[RankSeen, ...]
    servers: tuple[tuple[str, float], ...] = ()  # (health URL, seconds since it answered)


@dataclass(frozen=True)
class Hang:
    reason: str  # one line, for the outcome event
    details: list[str] = field(default_factory=list)  # one line per rank (and the server)
    beats: dict[int, dict] = field(default_factory=dict)  # the ranks' last heartbeats
    server: bool = False  # the server stopped answering


def slowest_step_s(seen: Seen) -> float:
    return max(((r.beat or {}).get("slowest_step_s") or 0.0 for r in seen.ranks), default=0.0)


def rank_limit(timeout: float | None, rank: RankSeen, slowest: float) -> float:
    return limit_for(timeout, (rank.beat or {}).get("phase"), slowest)


def find_hang(timeout: float | None, seen: Seen) -> Hang | None:
    """The hang in `seen`, or None: first every server silent past its limit, then the ranks
    silent past theirs, naming a rank whose process is stopped, stuck in the kernel or gone,
    else the one silent longest (the others usually wait for it in a collective)."""
    slowest = slowest_step_s(seen)
    if seen.servers:
        silent = min(s for _, s in seen.servers)
        limit = server_limit_for(timeout, slowest)
        if silent > limit:
            urls = [url for url, _ in seen.servers]
            if len(urls) == 1:
                which = f"the vLLM server did not answer {urls[0]}"
            else:
                which = f"no vLLM server answered ({', '.join(urls)})"
            return _hang(f"{which} for {silent:.0f}s ({_limit_text(timeout, limit)})", seen, True)
    stale = [r for r in seen.ranks if r.silent_s > rank_limit(timeout, r, slowest)]
    if not stale:
        return None
    first = min(stale, key=lambda r: (r.note == "", -r.silent_s))
    limit = rank_limit(timeout, first, slowest)
    reason = (
        f"no progress from rank {first.rank} for {first.silent_s:.0f}s "
        f"({_limit_text(timeout, limit)}); {describe(first)}"
    )
    return _hang(reason, seen)


def _limit_text(timeout: float | None, limit: float) -> str:
    kind = "hang_timeout" if timeout is not None else "automatic hang_timeout"
    return f"{kind} {limit:g}s"


def describe(rank: RankSeen) -> str:
    beat = rank.beat
    if beat is None:
        return "no heartbeat yet (still starting?)"
    where = f"pid {beat.get('pid')} on {beat.get('host')}{rank.note}"
    return f"last: {beat.get('phase')} at step {beat.get('step')} ({where})"


def _hang(reason: str, seen: Seen, server: bool = False) -> Hang:
    details = [f"rank {r.rank}: silent {r.silent_s:.0f}s; {describe(r)}" for r in seen.ranks]
    for url, silent in seen.servers:
        details.append(f"vLLM server {url}: last answered {silent:.0f}s ago")
    beats = {r.rank: r.beat for r in seen.ranks if r.beat is not None}
    return Hang(reason, details, beats, server)
