"""The Ray executor: the cluster, its pools, one worker actor per rank, streamed rollouts."""
