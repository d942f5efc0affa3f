"""Leader election (SPEC §2-§3): pure rules, member state, the reactor-driven elector."""
