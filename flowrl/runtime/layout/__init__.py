"""The runtime's side of the planner (flowrl.plan): `flowrl plan` with --gpus (planning) and --cluster
(auto_plan), the memory check `flowrl train` runs on its own layout before anything loads (memory_check), and a
run's record of its plan against what it measured (plan_record)."""
