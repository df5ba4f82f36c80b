"""`maxent-grpo runs` and `maxent-grpo plot`: what the runs are doing, read from their files.

- `events`: the run's event log (`<output_dir>/events.jsonl`), written by the launcher and the
  trainers, read here;
- `sources`: what else is on disk: output directories (markers, checkpoints, trainer state),
  log files found by name (never parsed), live processes in /proc;
- `state`: the state rules, from the events and those facts;
- `table`: one row per run; `queue`: the toolkit's jobs in the Slurm queue (squeue);
  `command`: `maxent-grpo runs` (files, queue, a sweep's points); `compare`: a sweep's points
  side by side (`runs --sweep`); `history`: a run's logged series and its headline metric;
  `plot`: a run's curves (`maxent-grpo plot`); `overlay`: several runs in one figure.
"""

from maxent_grpo.runs.command import main
from maxent_grpo.runs.state import KILLED, NO_EVENTS, decide_state
from maxent_grpo.runs.table import RunInfo, collect_runs, format_table

__all__ = ["KILLED", "NO_EVENTS", "RunInfo", "collect_runs", "decide_state", "format_table", "main"]
