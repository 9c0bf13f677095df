set(MC_TOOL_LINK mc_reshard mc_plan)
