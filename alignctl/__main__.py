from alignctl.cli import main

main()
