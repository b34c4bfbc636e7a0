"""The RL layer: pure-torch ops, loss objects, graph stages and shared subgraphs."""
