"""Benchmarks behind ``vllm-padplugin bench``: pure logic here, commands in ``cli.bench``.

``balance``/``routers`` simulate expert-parallel dispatch with and without padding masking
(pure torch); ``load`` times vLLM start-up with and without the plugin in fresh processes.
"""
