from graphrt.cli.main import main

main()
