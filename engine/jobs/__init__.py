"""Firing ``[[job]]``s: one fire of one job, read from an applied version (docs/jobs.md).

:mod:`.context` holds what every kind's runner receives and answers; each kind's runner lives in a
module named for it, and ``contextful job fire`` and serve's job child reach them through one table
of runners.
"""
