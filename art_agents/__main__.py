from art_agents.cli import run

run()
