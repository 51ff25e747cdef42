"""``python -m vllm_padplugin.cli``: the ``vllm-padplugin`` command."""
from vllm_padplugin.cli import main

main()
