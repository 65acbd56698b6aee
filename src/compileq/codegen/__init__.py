"""FX codegen on workers: the route a graph takes, the compile scheme Inductor runs, the
graph's key, and what makes DDP's subgraphs fast (deferred forwards, backwards sent ahead, the
AOTAutograd entries of DDP subgraphs)."""
