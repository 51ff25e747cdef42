"""The Triton kernels of :func:`vllm_padplugin.kernels.triton_grouped_topk.fused_grouped_topk`,
one module a kernel (``tile``, ``rows``, ``parts``, ``regs``) and the pieces they share.
Imported only where Triton is (the launcher guards it).
"""
