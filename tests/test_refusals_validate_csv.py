"""phaze-validate's CSV as a careless or hostile user writes it (session 64's probe round, issue
58): what a spreadsheet writes is read (CRLF, quoted cells, a trailing comma, spaces around the
header's commas); what is not a run file is refused in one line naming the line (or the row and
its column), read by the loader alone (no trace: fast)."""

from __future__ import annotations

import pytest

from phaze import validate as v
from phaze_ir.errors import PhazeError

HEADER = (
    "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
    "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)"
)
ROW = "1,2,1,64,2,2,32,1,1,1,10"


@pytest.mark.parametrize(
    "text",
    [
        HEADER + "\r\n" + ROW + "\r\n",
        HEADER + "\n" + ",".join(f'"{c}"' for c in ROW.split(",")) + "\n",
        HEADER + ",\n" + ROW + ",\n",
        HEADER.replace(",", " , ") + "\n" + ROW + "\n",
        HEADER + "\n" + ROW.replace(",10", ",1.0e1") + "\n",
    ],
    ids=["crlf", "quoted-cells", "trailing-comma", "spaced-header", "time-in-e-notation"],
)
def test_what_a_spreadsheet_writes_is_read(text):
    (run,) = v.parse_runs(text, "runs.csv")
    assert not run.refused and run.measured_ms == 10


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (HEADER.replace(",", ";") + "\n" + ROW.replace(",", ";") + "\n", "runs.csv: no column '# GPUs'"),
        (HEADER + ",iteration time (ms)\n" + ROW + ",11\n", "runs.csv:1: column 'iteration time (ms)' is given 2 "
                                                           "times"),
        (HEADER + ",\x1b[2Jx\n" + ROW + ",1\n", "runs.csv:1: unknown column 12 '\x1b[2Jx'"),
        ("# a\n# b\n", "runs.csv: no column '# GPUs'"),
        (ROW + "\n", "runs.csv: no column '# GPUs'"),
        (HEADER + "\n" + ROW + "," + "9" * (1 << 20) + "\n", "runs.csv:2: not CSV: field larger than field limit"),
        (HEADER + "\n" + ROW.replace("1,2,1,64,2", "3,3,1,64,2").replace("32,1,1,1", "32,3,1,1") + "\n",
         "runs.csv:2: row 1: 2 attention heads cannot be split over TP 3"),
    ],
    ids=["semicolons", "duplicate-column", "escape-code-column", "comments-only", "no-header", "1-mb-cell",
         "tp-not-dividing-heads"],
)  # fmt: skip
def test_what_is_not_a_run_file_is_refused_in_one_line(text, says):
    with pytest.raises(PhazeError) as info:
        v.parse_runs(text, "runs.csv")
    message = str(info.value)
    assert message.startswith(says) and "\n" not in message, message


@pytest.mark.parametrize(
    ("row", "says"),
    [
        (ROW.replace("64", "6\x004"), "'hidden size' is '6\\x004', expected a positive integer"),
        (ROW.replace(",64,", ',"1,024",'), "'hidden size' is '1,024', expected a positive integer"),
        ("1,2,1,64,2,2,32,-1,1,1,10", "'tensor parallelism' is '-1', expected a positive integer"),
    ],
    ids=["nul-in-a-cell", "thousands-separator", "negative-tp"],
)
def test_a_cell_that_is_no_count_is_refused_naming_its_row_and_column(row, says):
    with pytest.raises(PhazeError) as info:
        v.parse_runs(HEADER + "\n" + row + "\n", "runs.csv")
    message = str(info.value)
    assert message.startswith("runs.csv:2: row 1: ") and says in message and "\n" not in message, message
