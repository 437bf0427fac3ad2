"""Collectives queued on a communicator (communicator.py): in launch order, each once every rank launched
it (the sharded replay's lanes: tests/analysis/advise/sharded/test_replay.py)."""

import numpy as np

from analysis.advise.communicator import serial_collectives


def test_collectives_queue_behind_each_other_and_launch_in_order():
    # ready out of order: bucket 1 ready first (at 100) but launches after bucket 0 (ready at 500)
    launch = np.maximum.accumulate(np.array([[[500.0, 100.0]]]), axis=2)
    start, end = serial_collectives(launch, np.array([300.0, 300.0]))
    assert start.tolist() == [[500, 800]] and end.tolist() == [[800, 1100]]


def test_a_collective_starts_when_the_last_rank_launched_it():
    launch = np.array([[[100.0], [400.0]]])  # 1 step, 2 ranks, 1 bucket
    start, end = serial_collectives(launch, np.array([50.0]))
    assert start.tolist() == [[400]] and end.tolist() == [[450]]
