"""Constants of the analysis's numerics that its cost model reads too (posgen.plan), stated once. Standard library
only: the plan runs while the Snakefile parses."""

# masked_moments' token block: queries and keys summed in blocks of this many tokens, so that each query row has at
# most this many (three times as many in a sliding window) keys entered entry by entry; it fixes the order of the
# float sums, hence the last bits of every statistic
TOKEN_BLOCK = 32
