"""The failure policy every reward runs under during training (timeout, retry, None)."""

from __future__ import annotations

import logging
import signal
import threading

from maxent_grpo.rewards.common import RewardFunc, RewardUnavailable
from maxent_grpo.timers import timed

logger = logging.getLogger("maxent_grpo.rewards")

# A reward function that raises or hangs on one odd sample must not end a 30-hour run, and
# must not silently score it 0 either. Policy: the batch is retried one sample at a time; the
# samples that still fail (or exceed the time limit) score None, which TRL skips (NaN-aware
# mean), are counted in the `rewards/<name>/failures` metric, and are logged with their index.


class RewardTimeout(Exception):
    """A reward call ran past reward_timeout_seconds."""


def call_with_timeout(func, timeout: float | None, *args, **kwargs):
    """func(*args, **kwargs), raising RewardTimeout past `timeout` seconds (0 or None: no
    limit). SIGALRM only works on the main thread (where TRL scores rewards and calls tools);
    elsewhere: no limit."""
    if not timeout or threading.current_thread() is not threading.main_thread():
        return func(*args, **kwargs)

    def on_alarm(_signum, _frame):
        raise RewardTimeout(f"no result after {timeout:g}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return func(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _call_with_timeout(func: RewardFunc, timeout: float | None, completions, **kwargs):
    with timed("reward_func"):
        return call_with_timeout(func, timeout, completions, **kwargs)


class GuardedReward:
    """A reward function with the failure policy above; keeps the wrapped one's __name__."""

    def __init__(self, func: RewardFunc, timeout: float | None):
        self.func = func
        # A reward that bounds its own calls (remote.py: timeout x tries) gets no alarm on top.
        self.timeout = None if getattr(func, "bounds_itself", False) else timeout
        self.__name__ = getattr(func, "__name__", type(func).__name__)

    def __call__(self, completions, **kwargs):
        # reward_guard less reward_func: what the policy costs (bench/bench_overhead.py)
        with timed("reward_guard"):
            return self._guarded(completions, kwargs)

    def _guarded(self, completions, kwargs):
        try:
            scores = _call_with_timeout(self.func, self.timeout, completions, **kwargs)
            failures = 0
        except RewardUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of user code is handled alike
            logger.warning(
                "reward %s failed on a batch (%s: %s); retrying sample by sample",
                self.__name__,
                type(exc).__name__,
                exc,
            )
            scores, failures = self._per_sample(completions, kwargs)
        log_metric = kwargs.get("log_metric")
        # Logged only when a sample failed: TRL averages every logged metric across processes
        # with one collective per metric and step (with 2 CPU processes and 3 rewards, 3 extra
        # gathers, a few ms a step); a metric no process logs costs nothing.
        if failures and callable(log_metric):
            log_metric(f"rewards/{self.__name__}/failures", float(failures))
        return scores

    def _per_sample(self, completions, kwargs) -> tuple[list[float | None], int]:
        n = len(completions)
        scores: list[float | None] = []
        failures = 0
        for i in range(n):
            # Per-sample view of every per-sample keyword (solution, prompts, columns...).
            sample = {
                k: [v[i]] if isinstance(v, list) and len(v) == n else v for k, v in kwargs.items()
            }
            sample.pop("log_metric", None)
            try:
                scores.append(
                    _call_with_timeout(self.func, self.timeout, [completions[i]], **sample)[0]
                )
            except Exception as exc:  # noqa: BLE001
                failures += 1
                scores.append(None)
                logger.warning(
                    "reward %s: sample %d scored None (%s: %s)",
                    self.__name__,
                    i,
                    type(exc).__name__,
                    exc,
                )
        return scores, failures


def guard_rewards(funcs: list, timeout: float | None) -> list:
    """Apply the failure policy to every reward function; a reward model's name (a string,
    loaded and scored by TRL) passes as it is."""
    return [func if isinstance(func, str) else GuardedReward(func, timeout) for func in funcs]
