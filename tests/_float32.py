"""Tolerance for comparing float32 results computed twice or by two routes (TF kernels vs numpy, eager vs
graph, batch of 1 vs batch of 5): kernels may reorder sums (SIMD width differs between CPUs, e.g. AVX2 vs
AVX-512 vs ARM NEON), so results of order 1 can differ by a few units in the last place (float32 machine
epsilon 1.19e-7). rtol = atol = 1e-6 allows about 8 ulp; real defects (a wrong mean, a leaked sample, a lost
public batch) are orders of magnitude larger.
"""

F32 = {"rtol": 1e-6, "atol": 1e-6}
