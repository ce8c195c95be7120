"""The text `opplugin plan` prints for a Plan: its PlanRecord, built without kernels, formatted."""
from opplugin.report.plan import format_plan
from opplugin.runtime.plan_record import record_plan_alone


def describe(plan, wide=False):
    return format_plan(record_plan_alone(plan), wide)
