"""Scoring constants, free of torch (the command line's ``--help`` texts quote them without loading it)."""

# Probabilities are floored here before a logarithm: NLL = -log(max(p_gold, PROB_FLOOR)), so one
# confidently wrong answer adds at most -log(1e-12) = 27.6 nats instead of infinity.
PROB_FLOOR = 1e-12
