"""The measure core: interval algebra (intervals.py), step windows and phases, what each rank was doing
(activity.py), every collective call (collective_calls.py) and their pairing across ranks; every feature
measures from these."""
