from release.cli import main

main()
