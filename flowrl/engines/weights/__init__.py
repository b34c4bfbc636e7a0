"""How the actor's weights reach rollout engines: in-process syncs, buckets, transports."""
