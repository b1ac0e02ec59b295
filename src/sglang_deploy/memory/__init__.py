"""The memory of one launch: the planner (will a --mem-fraction-static fit, which to use), the one road to its
inputs, the architectures it knows by name, and what a start log says sglang measured."""
