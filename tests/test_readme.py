"""README numbers come from the report: the demo sentence is rendered from the
recorded demo report (bench/results/demo/) by tools/readme_numbers.py."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_demo_numbers_match_the_recorded_report():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "readme_numbers.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr + proc.stdout
