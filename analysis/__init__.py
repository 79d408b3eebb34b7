"""Analysis: result tables, figures, the what-if planner and reports. Reads run outputs; may call `sim`."""
