"""Count the host-device synchronisations of each training step, by call site (bench helper).

bench/steptimer.py installs it when STEPTIMER_SYNCS=1. A synchronisation is where the host
waits for the device: on a GPU every one stalls the launch queue (the GPU idles until the host
has queued more work), so each one in a step's code path is a cost bare TRL may not pay.

- On CUDA, torch's own sync debug mode (`torch.cuda.set_sync_debug_mode("warn")`) reports every
  synchronising operation (`.item()`, `.tolist()`, a copy to the host, `nonzero`, ...); each
  report is counted. Collectives are not covered by it: their `.item()` is.
- On CPU nothing synchronises, so the calls that would on a GPU are counted instead: `.item()`,
  `.tolist()`, `float()`/`int()`/`bool()` of a tensor, `.numpy()`, `.cpu()` and
  `torch.cuda.synchronize()`. An upper bound: some of these tensors would be on the host in
  a GPU run too (rewards, for example), and implicit ones (`nonzero`) are not seen.

A call site is the innermost Python frame outside torch (file:line function), and its owner the
package of that file (maxent_grpo, trl, transformers, accelerate, ...). Instrumenting costs a
stack walk per call: never time a run that counts.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter

_TORCH = os.sep + "torch" + os.sep
_HERE = os.path.abspath(__file__)
# Owners, most specific first: the package a site's file belongs to.
OWNERS = ("maxent_grpo", "trl", "transformers", "accelerate", "bench", "datasets", "torch")
_CPU_METHODS = ("item", "tolist", "__float__", "__int__", "__bool__", "numpy", "cpu")


def site_of(frame) -> str:
    """The innermost frame outside torch and this file, as `path:line function`."""
    while frame is not None and (
        _TORCH in frame.f_code.co_filename or frame.f_code.co_filename in (_HERE, warnings.__file__)
    ):
        frame = frame.f_back
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    for owner in OWNERS:
        marker = os.sep + owner + os.sep
        if marker in name:
            name = owner + os.sep + name.rsplit(marker, 1)[1]
            break
    return f"{name}:{frame.f_lineno} {frame.f_code.co_name}"


def owner_of(site: str) -> str:
    head = site.split(os.sep, 1)[0]
    return head if head in OWNERS else "other"


class SyncCounter:
    """Synchronisations since the last `take()`, by site."""

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self.mode = ""

    def record(self) -> None:
        self.counts[site_of(sys._getframe())] += 1

    def take(self) -> dict[str, int]:
        taken, self.counts = dict(self.counts), Counter()
        return taken

    def install(self) -> str:
        """Start counting: CUDA's sync debug mode on a GPU, the call wrappers on CPU."""
        import torch

        if torch.cuda.is_available():
            self._install_cuda(torch)
            self.mode = "cuda sync debug mode"
        else:
            self._install_cpu(torch)
            self.mode = "cpu: " + ", ".join(_CPU_METHODS) + ", torch.cuda.synchronize"
        return self.mode

    def _install_cuda(self, torch) -> None:
        shown = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if "synchronizing CUDA operation" in str(message):
                self.counts[site_of(sys._getframe())] += 1
                return
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        warnings.filterwarnings("always", message=".*synchronizing CUDA operation.*")
        torch.cuda.set_sync_debug_mode("warn")

    def _install_cpu(self, torch) -> None:
        for name in _CPU_METHODS:
            setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        torch.cuda.synchronize = self._counted(torch.cuda.synchronize)

    def _counted(self, method):
        def counted(*args, **kwargs):
            self.record()
            return method(*args, **kwargs)

        return counted
