"""Static and runtime drift checks of the plugin's upstream surface (``vllm-padplugin compat``).

``sigdiff``: pure signature model; ``source``: read a vLLM tree without importing it;
``checks``: the drift classes over ``vllm_padplugin.surface.SURFACE``; ``gitscan``:
first bad commit over a git range; ``plugin_scan``: another plugin's surface from its
source; ``render``: text/json/md.
"""
