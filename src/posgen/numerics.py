"""Constants of the analysis's numerics that its cost model reads too (posgen.plan), stated once. Standard library
only: the plan runs while the Snakefile parses."""

# masked_moments' token block: queries and keys summed in blocks of this many tokens, so that each query row has at
# most this many (three times as many in a sliding window) keys entered entry by entry; it fixes the order of the
# float sums, hence the last bits of every statistic
TOKEN_BLOCK = 32

# the degree of the smooth position bases (Legendre polynomials in the position): the position shares' smooth
# basis, Method A-drift's fit, and the coefficients of the held-out mean keys stored for Method A-shared
SMOOTH_DEGREE = 8

# the device layout (Decomposer ``batched``) solves Method B with the mask's factorised normal matrix up to this many
# tokens: (2 T)^2 float64 per sink, 0.54 GB at 4,096; past it, conjugate gradients
DENSE_TOKENS = 4096
