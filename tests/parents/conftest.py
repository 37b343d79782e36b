"""The parents' own suites: print their table at the end of the test session."""

from parentsuite import tables


def pytest_terminal_summary(terminalreporter):
    lines = tables()
    if lines:
        terminalreporter.section("the parents' own test suites with gpuspawner's classes")
        for line in lines:
            terminalreporter.write_line(line)
