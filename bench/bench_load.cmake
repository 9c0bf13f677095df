set(MC_TOOL_LINK mc_train)
