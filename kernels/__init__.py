"""slora_vtc_kernels: Triton kernels for the real engine, each beside a torch reference.

`reference` holds plain-torch versions of every op (the CPU path and the tests' ground truth);
the Triton versions have the same signatures. Import `ops(name)` to get either set.
"""
