from liger_core_llamafactory.cli import main

if __name__ == "__main__":
    main()
