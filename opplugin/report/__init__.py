"""Reports from the runtime's plain records: the timing table, the plan, the trace, and the JSON header they share."""
