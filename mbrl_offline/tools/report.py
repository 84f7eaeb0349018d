"""Report logged runs and sweeps: `mbrl-report runs/... [sweeps/...] [--out reports]`.

Each path is a run folder (written by train.py), a sweep folder (sweep.py) or a folder holding them.
Writes ``report.md`` (a table of final normalised scores per algorithm and dataset: last evaluation and
mean of the last ten, mean ± std over seeds; for sweeps the best trials, parameter importances and the
online evaluation episodes the tuning used) and learning-curve PNGs beside it. ``--help`` lists the
options; ``--cfg job`` prints them as YAML and reads nothing.
"""
import shlex

from mbrl_offline.cli import ToolArgumentParser, cli_main, invoked_as


@cli_main
def main(argv: list[str]) -> None:
    from mbrl_offline.report import write_report

    parser = ToolArgumentParser(invoked_as(), __doc__)
    parser.add_argument("paths", nargs="+", help="run folders, sweep folders, or folders holding them")
    parser.add_argument("--out", default="reports", help="folder for report.md and the PNG figures (default: reports)")
    args = parser.parse_args(argv)
    command = " ".join([invoked_as(), *(shlex.quote(a) for a in argv)])
    report = write_report(args.paths, args.out, command)
    print(f"wrote {report} and {len(list(report.parent.glob('*.png')))} figure(s) in {report.parent}")


if __name__ == "__main__":
    main()
