"""A run's output directory, the files through which its processes meet: the event log, the
checkpoints and their markers, the stop file, heartbeats and exit reports, the evaluation
records. A leaf: the trainers write these files, the launcher, evaluations and the runs table
read them, and none of them imports another for it.
"""
