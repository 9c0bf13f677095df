set(MC_TOOL_LINK mc_train mc_plan)
