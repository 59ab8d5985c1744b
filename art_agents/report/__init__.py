"""Reporting: what training and evaluation did, for people and for other tools.

`reporters` sends each step's metrics to where `report_to` names (W&B, Langfuse, OpenPipe); `page` writes a
model's HTML report page and `tables` its tables; `command` is `art-agents report`; `log_file` the log
every command keeps.
"""
