"""When the shadow reads: the scheduler (the idle window and the ration between the host's
decode rounds, the chunk cost model) and the in-process host interface that drives it."""
