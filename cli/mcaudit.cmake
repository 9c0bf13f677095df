# mc_plan only for the memory category names mcplan uses (plan/plan.h).
set(MC_TOOL_LINK mc_reshard mc_plan)
