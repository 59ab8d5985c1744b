from art_agents.cli.main import run

run()
