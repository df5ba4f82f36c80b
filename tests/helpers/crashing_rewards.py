"""A reward function that crashes the trainer on its first call (loaded as module:function).

It ends the process with os._exit, as a segfault or the OOM killer would: the reward guard
(which turns a reward's exceptions into None scores) cannot catch that.
"""

import os
import sys


def boom(completions, **kwargs):
    print("boom: this reward function crashes the trainer on purpose (test)", flush=True)
    sys.stderr.flush()
    os._exit(3)
